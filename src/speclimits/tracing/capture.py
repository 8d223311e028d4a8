"""Router capture into a preallocated static buffer, and unique-expert counting.

vLLM's MoE routers (``BaseRouter``, reached through each ``MoERunner`` of the target) call an optional
``capture_fn(topk_ids)`` with the *logical* expert ids of the forward, ``[num_tokens, top_k]``, before any
EPLB mapping. The callback copies them into one buffer allocated once, ``[max_tokens, n_moe_layers, top_k]``.
On CPU it runs on every forward. On GPU with CUDA graphs a Python callback runs only while a graph is
captured; being a single ``copy_`` into a fixed address, the copy is recorded into the graph and replayed
(the pattern of vLLM's ``RoutedExpertsCapturer``; not run on a GPU here). Rows past the step's real tokens
(graph padding) hold junk, dropped by the reader. Rows follow the forward's token order: requests in
``input_batch.req_ids`` order, each ``num_scheduled_tokens`` consecutive rows.

The counting helpers take numpy arrays ``[rows, n_layers, top_k]``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from speclimits.errors import SpeclimitsError


class RoutingCapture:
    """A static routing buffer for ``n_layers`` MoE layers, forwards of up to ``max_tokens`` tokens (padding
    included), on ``device``, and the per-layer callbacks that fill it."""

    def __init__(self, n_layers: int, top_k: int, max_tokens: int, device: Any = "cpu") -> None:
        import torch

        if n_layers < 1 or top_k < 1 or max_tokens < 1:
            raise ValueError(f"n_layers, top_k and max_tokens must be >= 1, got {n_layers}, {top_k}, {max_tokens}")
        self.n_layers = int(n_layers)
        self.top_k = int(top_k)
        self.max_tokens = int(max_tokens)
        # int16 holds expert ids up to 32767; -1 marks rows never written
        self.buffer = torch.full((self.max_tokens, self.n_layers, self.top_k), -1, dtype=torch.int16, device=device)
        self._routers: list[Any] = []
        self.plan: Any = None  # planted routing (:meth:`plant`)

    def plant(self, ids: Any) -> None:
        """Make forwards of ``num_tokens`` tokens route by ``ids`` ([n_layers, num_tokens, top_k]): each callback
        overwrites ``topk_ids`` in place before the MoE kernel reads them (the weights stay the router's: only
        the pass's cost is meaningful). CPU only."""
        import torch

        ids = torch.as_tensor(ids)
        if ids.ndim != 3 or ids.shape[0] != self.n_layers or ids.shape[2] != self.top_k:
            raise ValueError(f"planted routing must have shape [{self.n_layers}, num_tokens, {self.top_k}], "
                             f"got {tuple(ids.shape)}")
        self.plan = ids.to(device=self.buffer.device)

    def capture_fn(self, layer: int) -> Callable[[Any], None]:
        """The callback for MoE layer ``layer`` (0-based among the bound layers)."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} outside the capture buffer's {self.n_layers} layers")
        buf = self.buffer
        max_tokens = self.max_tokens

        def capture(topk_ids: Any) -> None:
            n = topk_ids.shape[0]
            if n > max_tokens:
                raise SpeclimitsError(
                    f"routing capture: a forward routed {n} tokens but the static buffer holds {max_tokens}; "
                    "raise max_num_batched_tokens consistently or report this as a bug")
            plan = self.plan
            if plan is not None and plan.shape[1] == n:
                # the designed experiment: the kernel reads the planted ids instead of the router's
                topk_ids.copy_(plan[layer])
            # one fixed-address copy: safe under CUDA graph capture and replay
            buf[:n, layer].copy_(topk_ids)

        return capture

    def bind(self, routers: list[Any]) -> None:
        """Install the callbacks on ``routers`` (objects with ``set_capture_fn``), layer i -> routers[i]."""
        if len(routers) != self.n_layers:
            raise ValueError(f"{len(routers)} routers given for a buffer of {self.n_layers} layers")
        for i, router in enumerate(routers):
            router.set_capture_fn(self.capture_fn(i))
        self._routers = list(routers)

    def unbind(self) -> None:
        """Remove the callbacks installed by :meth:`bind`."""
        for router in self._routers:
            router.set_capture_fn(None)
        self._routers = []

    def snapshot(self, n_rows: int) -> Any:
        """A copy of the first ``n_rows`` rows, still on the buffer's device (no host sync)."""
        if n_rows > self.max_tokens:
            raise ValueError(f"asked for {n_rows} rows of a {self.max_tokens}-row buffer")
        return self.buffer[:n_rows].clone()


def to_numpy(t: Any) -> np.ndarray:
    """A (possibly device) tensor as a numpy array (synchronises on GPU)."""
    return t.detach().to("cpu").numpy()


def _seen(rows: np.ndarray, n_experts: int | None, groups: np.ndarray | None, n_groups: int) -> np.ndarray:
    """Which experts each layer routed to, per group of rows (``groups``: (m,) ints in 0..n_groups-1, None:
    one group): bool [n_groups, n_layers, n_experts]. Negative ids are not experts."""
    rows = np.asarray(rows)
    if rows.ndim != 3:
        raise ValueError(f"rows must have shape [m, n_layers, top_k], got {rows.shape}")
    if n_experts is None:
        n_experts = int(rows.max()) + 1 if rows.size else 1
    n_layers = rows.shape[1]
    ids = np.where(rows < 0, n_experts, rows.astype(np.int64))  # invalid ids land in a spare slot
    group = np.zeros(len(rows), dtype=np.int64) if groups is None else np.asarray(groups)
    seen = np.zeros((n_groups, n_layers, n_experts + 1), dtype=bool)
    seen[group[:, None, None], np.arange(n_layers)[None, :, None], ids] = True
    return seen[:, :, :n_experts]


def unique_per_layer(rows: np.ndarray, n_experts: int | None = None, groups: np.ndarray | None = None,
                     n_groups: int = 1) -> np.ndarray:
    """Unique experts per layer over ``rows`` -> [n_layers]; with ``groups`` (the group of each row, counted in
    one scatter) -> [n_groups, n_layers]. ``n_experts`` None: the largest id + 1."""
    counts = _seen(rows, n_experts, groups, n_groups).sum(axis=2)
    return counts if groups is not None else counts[0]


def cumulative_unique(rows: np.ndarray, n_experts: int) -> np.ndarray:
    """[m, n_layers]: entry [j, l] = unique experts of layer l over rows 0..j (windows m = 1..rows)."""
    m = len(np.asarray(rows))
    return np.logical_or.accumulate(_seen(rows, n_experts, np.arange(m), m), axis=0).sum(axis=2)

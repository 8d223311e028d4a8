"""Router capture into a preallocated static buffer, and unique-expert counting.

vLLM's MoE routers (``BaseRouter`` subclasses, reached through each ``MoERunner`` module of
the target) call an optional ``capture_fn(topk_ids)`` with the *logical* expert ids of the
forward, shape ``[num_tokens, top_k]``, before any EPLB mapping. The callback here copies
them into one buffer allocated once, shape ``[max_tokens, n_moe_layers, top_k]``:

* on CPU the callback runs on every forward, so the buffer holds the routing of the last
  forward;
* on GPU with CUDA graphs a Python callback runs only while a graph is captured; because the
  callback is a single ``copy_`` into a fixed address (a slice of the static buffer whose
  size is fixed per captured graph), the copy is recorded into the graph and replayed on
  every later run. Rows beyond the real tokens of a step (graph padding) hold junk and are
  dropped by the reader, which knows the unpadded token count. This is the same pattern as
  vLLM's own ``RoutedExpertsCapturer``. (Written against the API; not run on a GPU here.)

Rows follow the target forward's token order: requests in ``input_batch.req_ids`` order,
each contributing ``num_scheduled_tokens`` consecutive rows.

Counting helpers work on numpy arrays of shape ``[rows, n_layers, top_k]``:
:func:`unique_per_layer` (unique experts per layer over the rows, or over each group of them) and
:func:`cumulative_unique` (the same for every prefix of the rows, i.e. windows m = 1..rows).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from speclimits.errors import SpeclimitsError


class RoutingCapture:
    """A static routing buffer and the per-layer callbacks that fill it.

    Parameters
    ----------
    n_layers : number of MoE layers that will be bound (buffer's second axis).
    top_k : experts per token.
    max_tokens : largest number of tokens of one forward (padded size included).
    device : torch device of the buffer (the model's device).
    """

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
        #: Planted routing for the next forward (designed experiment), a CPU tensor
        #: [n_layers, num_tokens, top_k]; None = the router's own choice. See :meth:`plant`.
        self.plan: Any = None

    def plant(self, ids: Any) -> None:
        """Make the next forward route by ``ids`` ([n_layers, num_tokens, top_k] ints; None: the router's own).

        Each layer's callback overwrites the router's ``topk_ids`` in place, before the MoE kernel
        reads them, when the forward has ``num_tokens`` tokens (the routing weights stay the
        router's: the output is not the model's, only the cost of the pass is measured). CPU
        only: on a GPU the callback is replayed inside CUDA graphs.
        """
        import torch

        if ids is None:
            self.plan = None
            return
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
    """Which experts each layer routed to, per group of rows: bool [n_groups, n_layers, n_experts].

    ``rows``: int [m, n_layers, top_k]; negative ids are not experts. ``groups``: the group of each row
    ((m,) ints in 0..n_groups-1; None: one group). ``n_experts`` None: the largest id + 1."""
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
    """Unique experts per layer over ``rows`` ([m, n_layers, top_k] int) -> int array [n_layers]; with
    ``groups`` (the group of each row, 0..n_groups-1: e.g. the rounds of a generation, counted in one
    scatter) int array [n_groups, n_layers]. ``n_experts`` None: the largest id + 1."""
    counts = _seen(rows, n_experts, groups, n_groups).sum(axis=2)
    return counts if groups is not None else counts[0]


def cumulative_unique(rows: np.ndarray, n_experts: int) -> np.ndarray:
    """Unique experts per layer over each prefix of ``rows`` ([m, n_layers, top_k] int; negative ids
    are ignored): int array [m, n_layers], entry [j, l] = unique experts of layer l over rows 0..j."""
    m = len(np.asarray(rows))
    return np.logical_or.accumulate(_seen(rows, n_experts, np.arange(m), m), axis=0).sum(axis=2)

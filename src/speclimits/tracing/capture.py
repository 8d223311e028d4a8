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
:func:`unique_per_layer` (unique experts per layer over the rows) and
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

    def read(self, n_rows: int) -> np.ndarray:
        """The first ``n_rows`` rows as a numpy int16 array ``[n_rows, n_layers, top_k]``."""
        return to_numpy(self.snapshot(n_rows))


def to_numpy(t: Any) -> np.ndarray:
    """A (possibly device) tensor as a numpy array (synchronises on GPU)."""
    return t.detach().to("cpu").numpy()


def unique_per_layer(rows: np.ndarray, n_experts: int) -> np.ndarray:
    """Unique experts per layer over ``rows`` ([m, n_layers, top_k] int) -> int array [n_layers]."""
    rows = np.asarray(rows)
    if rows.ndim != 3:
        raise ValueError(f"rows must have shape [m, n_layers, top_k], got {rows.shape}")
    n_layers = rows.shape[1]
    seen = np.zeros((n_layers, n_experts + 1), dtype=bool)
    ids = np.where(rows < 0, n_experts, rows).astype(np.int64)
    seen[np.arange(n_layers)[None, :, None], ids] = True
    return seen[:, :n_experts].sum(axis=1)


def cumulative_unique(rows: np.ndarray, n_experts: int) -> np.ndarray:
    """Unique experts per layer over each prefix of ``rows``.

    Parameters
    ----------
    rows : int array [m, n_layers, top_k] of expert ids (negative ids are ignored).
    n_experts : number of experts per layer.

    Returns
    -------
    int array [m, n_layers]: entry [j, l] = unique experts of layer l over rows 0..j.
    """
    rows = np.asarray(rows)
    if rows.ndim != 3:
        raise ValueError(f"rows must have shape [m, n_layers, top_k], got {rows.shape}")
    m, n_layers, _ = rows.shape
    seen = np.zeros((m, n_layers, n_experts + 1), dtype=bool)
    ids = np.where(rows < 0, n_experts, rows).astype(np.int64)  # invalid ids land in a spare slot
    r_idx = np.arange(m)[:, None, None]
    l_idx = np.arange(n_layers)[None, :, None]
    seen[r_idx, l_idx, ids] = True
    seen = np.logical_or.accumulate(seen[:, :, :n_experts], axis=0)
    return seen.sum(axis=2)


def u_bar_e_max(rows: np.ndarray, n_experts: int) -> tuple[float, float]:
    """(Ū, E_max) of a pass: mean and max over layers of the unique experts over ``rows``."""
    counts = unique_per_layer(rows, n_experts)
    return float(counts.mean()), float(counts.max())


def new_experts(prev: np.ndarray, cur: np.ndarray) -> float:
    """Experts per layer in ``cur`` ([n_layers, top_k]) absent from ``prev``, averaged over layers."""
    n_layers = cur.shape[0]
    out = 0
    for layer in range(n_layers):
        out += len(set(cur[layer].tolist()) - set(prev[layer].tolist()))
    return out / n_layers

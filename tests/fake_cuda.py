"""CUDA stream ordering, checked on CPU tensors: a recording stand-in for torch.cuda's streams and events, and a
race checker over the accesses to watched tensors (found by a torch dispatch mode, from each op's schema).

The model is CUDA's. Work on one stream runs in issue order. ``s.wait_event(e)`` orders the work ``s`` is given
afterwards after the work ``e``'s stream had been given when ``e`` was recorded (an event never recorded orders
nothing); ``wait_stream`` is a record and a wait. A host synchronization (``Event.synchronize``,
``Stream.synchronize``, a ``.item()`` of a device tensor, which synchronizes its stream) orders all work issued
afterwards, on any stream, after what it waited for. A CPU op on host memory runs when it is issued. Nothing else
orders two streams: not a thread join, not a lock. A thread's current stream starts as the default stream.

NCCL's rule (``install(..., collectives=True)``): a collective issued from stream S runs on the collective stream
(``nccl``, one per process group, its collectives in issue order) after the work S had been given; it reads its
inputs and writes its outputs there. Its work's ``wait()`` orders the *current* stream after it, not the host;
``async_op=False`` is an issue and a wait. The host sees what a stream wrote only once it synchronized with it:
``.cpu()``, ``.tolist()`` and ``.item()`` of a device tensor copy on the current stream and wait for it (ordered
after a ``wait()`` on that stream), while ``.numpy()`` of one reads it in place (as pinned or mapped memory is
read), so it needs a synchronization. Each collective's tensors are watched from then on (kept alive, so no later
tensor reuses their memory under their name).

Each stream carries a vector clock; an access is ordered before a later one iff the later one's clock covers it.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST = "host"
COLLECTIVE = "nccl"
#: the collectives wrapped by ``install(collectives=True)``: name -> (positions of outputs, positions of inputs);
#: the ones lsm_gnn.comm calls
COLLECTIVES = {"all_to_all_single": ((0,), (1,))}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, 0), v)
    return out


class FakeStream:
    def __init__(self, rec: "StreamRecorder", name: str, device=None):
        self.rec, self.name, self.device = rec, name, torch.device("cuda", 0) if device is None else device

    def wait_event(self, event: "FakeEvent") -> None:
        with self.rec.lock:
            self.rec.log.append(("wait", self.name, event.source))
            self.rec.clock[self.name] = _merge(self.rec.clock.get(self.name, {}), event.clock)

    def wait_stream(self, other: "FakeStream") -> None:
        event = FakeEvent(self.rec)
        event.record(other)
        self.wait_event(event)

    def record_event(self, event: "FakeEvent | None" = None) -> "FakeEvent":
        event = event or FakeEvent(self.rec)
        event.record(self)
        return event

    def synchronize(self) -> None:
        with self.rec.lock:
            self.rec.host = _merge(self.rec.host, self.rec.clock.get(self.name, {}))

    def __repr__(self):
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, rec: "StreamRecorder", *args, **kwargs):
        self.rec, self.clock, self.source = rec, {}, None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.rec.current_stream()
        with self.rec.lock:
            self.rec.log.append(("record", stream.name))
            self.clock, self.source = dict(self.rec.clock.get(stream.name, {})), stream.name

    def synchronize(self) -> None:
        with self.rec.lock:
            self.rec.host = _merge(self.rec.host, self.clock)

    def query(self) -> bool:
        return True


class StreamRecorder:
    """Replaces torch.cuda's Stream, Event, stream, current_stream (``install``) and records, per access to a
    watched tensor under ``mode()``, its stream and vector clock; ``races()`` lists conflicting accesses that no
    stream order, event or host synchronization orders."""

    def __init__(self):
        self.lock = threading.RLock()
        self.local = threading.local()
        self.default = FakeStream(self, "default")
        self.clock: dict[str, dict] = {}
        self.host: dict = {}  # what the host has seen complete
        self.log: list = []
        self.accesses: list[tuple] = []  # (tensor name, write, stream, seq, clock, what)
        self.watched: dict[int, tuple[str, bool]] = {}  # storage address -> (name, on the device)
        self._names = 0
        self._issued = 0  # collectives issued
        self._kept: list[torch.Tensor] = []  # the collectives' tensors: their memory never gets another name
        self.recording = threading.local()  # .depth: how many access modes this thread is in

    # -- torch.cuda's API -------------------------------------------------------------------------------------

    def install(self, monkeypatch, collectives: bool = False) -> None:
        """``collectives``: torch.distributed's collectives (:data:`COLLECTIVES`) follow NCCL's rule."""
        rec = self

        def new_stream(device=None, priority=0, **kwargs):
            with rec.lock:
                rec._names += 1
                return FakeStream(rec, f"side{rec._names}")

        monkeypatch.setattr(torch.cuda, "Stream", new_stream)
        monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: FakeEvent(rec))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: rec.current_stream())
        monkeypatch.setattr(torch.cuda, "stream", rec.use_stream)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)  # an allocator hint
        if collectives:
            import torch.distributed as dist

            for name, (outputs, inputs) in COLLECTIVES.items():
                monkeypatch.setattr(dist, name, rec._collective(getattr(dist, name), outputs, inputs))
            for name, synced in (("cpu", True), ("tolist", True), ("numpy", False)):
                monkeypatch.setattr(torch.Tensor, name, rec._host_read(getattr(torch.Tensor, name), synced))

    def current_stream(self) -> FakeStream:
        return getattr(self.local, "stream", None) or self.default

    @contextlib.contextmanager
    def use_stream(self, stream):
        before = getattr(self.local, "stream", None)
        self.local.stream = stream
        try:
            yield
        finally:
            self.local.stream = before

    # -- NCCL's rule --------------------------------------------------------------------------------------------

    def _collective(self, run, outputs: tuple, inputs: tuple):
        rec = self

        def issue(*args, async_op: bool = False, **kwargs):
            work = run(*args, async_op=True, **kwargs)  # the data moves (gloo) or is made up (the fake group)
            with rec.lock:
                rec._issued += 1
                what = f"{run.__name__} #{rec._issued}"
                clock = _merge(_merge(rec.clock.get(COLLECTIVE, {}), rec.clock.get(rec.current_stream().name, {})),
                               rec.host)
                clock[COLLECTIVE] = clock.get(COLLECTIVE, 0) + 1
                rec.clock[COLLECTIVE] = clock
                rec.log.append(("collective", rec.current_stream().name, what))
                for positions, write in ((inputs, False), (outputs, True)):
                    for i in positions:
                        t = args[i]
                        name = rec.watched.setdefault(t.untyped_storage().data_ptr(),
                                                      (f"{what} {'output' if write else 'input'}", True))[0]
                        rec._kept.append(t)
                        rec.accesses.append((name, write, COLLECTIVE, clock[COLLECTIVE], dict(clock),
                                             f"{what} on {COLLECTIVE}"))
            done = _Work(rec, work, dict(clock))
            if async_op:
                return done
            done.wait()
            return None

        return issue

    def _host_read(self, read, synced: bool):
        """``synced``: the host copies on the current stream and waits for it (else it reads in place)."""
        rec = self

        def host_read(t: torch.Tensor, *args, **kwargs):
            watched = rec.watched.get(t.untyped_storage().data_ptr())
            if watched is not None and watched[1] and getattr(rec.recording, "depth", 0):
                with rec.lock:
                    where = rec.current_stream().name if synced else HOST
                    clock = _merge(rec.host, rec.clock.get(where, {})) if synced else dict(rec.host)
                    clock[where] = clock.get(where, 0) + 1
                    if synced:
                        rec.clock[where] = clock
                    rec.host = _merge(rec.host, clock)
                    rec.accesses.append((watched[0], False, where, clock[where], dict(clock),
                                         f"{read.__name__}() on {where} in {threading.current_thread().name}"))
                if read.__name__ == "cpu":  # a copy to the host: not the device tensor
                    return t.detach().clone()
            return read(t, *args, **kwargs)

        return host_read

    # -- accesses ---------------------------------------------------------------------------------------------

    def watch(self, device: dict[str, torch.Tensor], host: dict[str, torch.Tensor] = {}) -> None:
        """``device``: tensors that live on the GPU; ``host``: pinned host tensors (a CPU op on them runs at once)."""
        for names, on_device in ((device, True), (host, False)):
            for name, t in names.items():
                self.watched[t.untyped_storage().data_ptr()] = (name, on_device)

    def access(self, func, args, kwargs) -> None:
        touched = []
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.watched:
                    name, on_device = self.watched[t.untyped_storage().data_ptr()]
                    write = arg.alias_info is not None and arg.alias_info.is_write
                    touched.append((name, write, on_device))
        scalar = func is torch.ops.aten._local_scalar_dense.default
        if not touched and not scalar:
            return
        with self.lock:
            if touched and not any(on_device for _, _, on_device in touched):  # a CPU op on host memory
                clock = dict(self.host)
                clock[HOST] = clock.get(HOST, 0) + 1
                self.host, where = clock, HOST
            else:
                where = self.current_stream().name
                clock = _merge(self.clock.get(where, {}), self.host)
                clock[where] = clock.get(where, 0) + 1
                self.clock[where] = clock
            what = f"{func.name()} on {where} in {threading.current_thread().name}"
            for name, write, _ in touched:
                self.accesses.append((name, write, where, clock[where], dict(clock), what))
            if scalar:  # .item(): the host waits for the stream
                self.host = _merge(self.host, clock)

    def mode(self) -> "_AccessMode":
        return _AccessMode(self)

    def races(self) -> list[str]:
        """Conflicting accesses (one writes) from two streams, or a stream and the host, with no order."""
        out = []
        for j, (name, write, where, _, clock, what) in enumerate(self.accesses):
            for name_i, write_i, where_i, seq_i, _, what_i in self.accesses[:j]:
                if name_i == name and (write or write_i) and where_i != where and clock.get(where_i, 0) < seq_i:
                    out.append(f"{name}: {'write' if write_i else 'read'} by {what_i} is not ordered before "
                               f"{'write' if write else 'read'} by {what}")
        return out

    def writers(self, name: str) -> set[str]:
        return {where for n, write, where, *_ in self.accesses if n == name and write}


class _Work:
    """A collective's work under NCCL's rule: ``wait()`` orders the current stream after it, not the host."""

    def __init__(self, rec: StreamRecorder, work, clock: dict):
        self.rec, self.work, self.clock = rec, work, clock

    def wait(self, timeout=None) -> bool:
        self.work.wait()  # gloo's data has arrived; the host learns nothing from it under NCCL's rule
        stream = self.rec.current_stream()
        with self.rec.lock:
            self.rec.log.append(("wait", stream.name, COLLECTIVE))
            self.rec.clock[stream.name] = _merge(self.rec.clock.get(stream.name, {}), self.clock)
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


class _AccessMode(TorchDispatchMode):
    def __init__(self, rec: StreamRecorder):
        super().__init__()
        self.rec = rec

    def __enter__(self):
        self.rec.recording.depth = getattr(self.rec.recording, "depth", 0) + 1
        return super().__enter__()

    def __exit__(self, *exc):
        self.rec.recording.depth -= 1
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not func.is_view:
            self.rec.access(func, args, kwargs)
        return func(*args, **kwargs)


def scheduled_thread(rec: StreamRecorder, schedule: str):
    """A ``threading.Thread`` whose body runs (under ``rec``'s access tracking) either all at once when started
    (``early``) or only when joined (``late``): the two extreme interleavings with the thread that started it."""

    class ScheduledThread(threading.Thread):
        _begun = False

        def start(self):
            if schedule == "early":
                self._begin()
                super().join()

        def join(self, timeout=None):
            self._begin()
            super().join(timeout)

        def _begin(self):
            if not self._begun:
                self._begun = True
                super().start()

        def run(self):
            with rec.mode():
                super().run()

    return ScheduledThread

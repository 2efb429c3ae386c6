"""lockstep.distributed: every collective of a PyTorch training loop checked by lockstep's channel.

Two ways in, one checker (the CheckedGroup of liblockstep that the CLI's ranks use, docs/python/distributed.md):

    import lockstep.distributed
    dist.init_process_group("lockstep")  # Gloo on the CPU, NCCL on CUDA; every collective checked

or, for a process group you already have, ``group = lockstep.distributed.wrap(group)`` and hand it to
DistributedDataParallel or to the collectives' ``group=`` argument.

Before a collective runs, the ranks exchange a fingerprint of it (sequence number, op, reduce op or
root, dtypes and shapes): when they disagree, every rank raises lockstep.CollectiveMismatch naming
each rank's call and Python call site, and nothing is sent. The call returns its Work at once: the
channel's worker thread checks the collective in its turn, then issues it on the wrapped group. A rank that died is named as
lockstep.CollectiveFailure (PeerLost) within seconds, one that stalls when the group's timeout
expires. Then the real backend (the wrapped group's) runs the collective unchanged, so results are
bitwise those without the wrapper. Point-to-point send and recv pass through unchecked.
"""
import datetime
import os
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from . import _C

__all__ = ["CheckedProcessGroup", "wrap", "BACKEND"]

BACKEND = "lockstep"  # the name registered with torch.distributed.Backend

_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default for Gloo

# Frames in these packages are not the user's call site: the first frame outside them is reported.
_NOT_USER = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules[__name__.rsplit(".", 1)[0]]))
_FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "torchmetrics")

_REDUCE_NAMES = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "product"),
                 (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.BAND, "band"),
                 (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor")]


_not_user_cache = [-1, ()]  # (len(sys.modules) when computed, _not_user_dirs())


def _not_user_dirs():
    """torch's, lockstep's and the loaded frameworks' directories; computed again only when a module was imported
    since (every collective asks)."""
    if _not_user_cache[0] == len(sys.modules):
        return _not_user_cache[1]
    dirs = list(_NOT_USER)
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(module.__file__) + os.sep)
    _not_user_cache[:] = [len(sys.modules), tuple(dirs)]
    return _not_user_cache[1]


def _call_site():
    """(tag, file, line) of the first Python frame outside torch, lockstep and the training frameworks;
    the tag names the API the collective came through: torch.distributed's function, or C++ (DDP's
    reducer, an extension) when no torch.distributed frame called it."""
    skip = _not_user_dirs()
    frame = sys._getframe(2)  # the caller of the overridden method
    api = f"dist.{frame.f_code.co_name}" if frame.f_code.co_filename.endswith("distributed_c10d.py") else "C++ caller"
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return f"{api}, no Python caller", "?", 0
    return f"{api} in {frame.f_code.co_name}", frame.f_code.co_filename, frame.f_lineno


def _reduce_name(opts):
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return "sum"
    for known, name in _REDUCE_NAMES:
        try:
            if op == known:
                return name
        except (TypeError, RuntimeError):  # PREMUL_SUM and other ops that carry a value
            break
    return "custom"


def _root(opts):
    return getattr(opts, "rootRank", 0)


def _flat(tensors):
    if isinstance(tensors, torch.Tensor):  # the one-tensor overloads (allreduce(tensor), ...)
        return [tensors]
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            out.append(t)
        else:
            out.extend(_flat(t))
    return out


# Each checked method of torch's ProcessGroup (the names torch.distributed and DDP call): the op's
# name as reported, and the tensors every rank must agree on: those whose shapes are the same on every
# rank also in uneven collectives (all_gather's outputs, reduce_scatter's inputs); none for all_to_all.
def _op_all_reduce(args, opts):
    return f"all_reduce({_reduce_name(opts)})", _flat(args[0])


def _op_all_reduce_coalesced(args, opts):
    return f"all_reduce_coalesced({_reduce_name(opts)})", _flat(args[0])


def _op_all_gather(args, opts):
    return "all_gather", _flat(args[0])  # every rank's part, as every rank receives them


def _op_all_gather_single(args, opts):
    return "all_gather_into_tensor", _flat([args[0]])


def _op_broadcast(args, opts):
    return f"broadcast(root {_root(opts)})", _flat(args[0])


def _op_reduce(args, opts):
    return f"reduce({_reduce_name(opts)}, root {_root(opts)})", _flat(args[0])


def _op_reduce_scatter(args, opts):
    return f"reduce_scatter({_reduce_name(opts)})", _flat([args[1]])  # the parts for every rank


def _op_gather(args, opts):
    return f"gather(root {_root(opts)})", _flat([args[1]])


def _op_scatter(args, opts):
    return f"scatter(root {_root(opts)})", _flat([args[0]])


def _op_alltoall(args, opts):
    return "all_to_all", []  # the parts' sizes may differ between ranks


def _op_barrier(args, opts):
    return "barrier", []


_CHECKED = {
    "allreduce": _op_all_reduce,
    "allreduce_coalesced": _op_all_reduce_coalesced,
    "allgather": _op_all_gather,
    "allgather_coalesced": _op_all_gather,
    "all_gather_single": _op_all_gather_single,
    "all_gather_single_coalesced": _op_all_gather,
    "allgather_into_tensor_coalesced": _op_all_gather,
    "_allgather_base": _op_all_gather_single,
    "broadcast": _op_broadcast,
    "reduce": _op_reduce,
    "reduce_scatter": _op_reduce_scatter,
    "reduce_scatter_single": _op_reduce_scatter,
    "reduce_scatter_single_coalesced": _op_reduce_scatter,
    "reduce_scatter_tensor_coalesced": _op_reduce_scatter,
    "_reduce_scatter_base": _op_reduce_scatter,
    "gather": _op_gather,
    "gather_single": _op_gather,
    "scatter": _op_scatter,
    "alltoall": _op_alltoall,
    "alltoall_base": _op_alltoall,
    "all_to_all_single": _op_alltoall,
    "barrier": _op_barrier,
}

_BACKEND_TYPES = {"gloo": dist.ProcessGroup.BackendType.GLOO, "nccl": dist.ProcessGroup.BackendType.NCCL}


class _Failed:
    """A collective's future value when its check or its issue failed: reading it raises the error."""

    def __init__(self, error):
        self.error = error


def _value_or_raise(gate):
    value = gate.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class _CheckedWork(dist.Work):
    """What a checked collective returns at once: the channel's worker checks it after every collective
    submitted before it and then issues it on the wrapped group; wait() and the future complete with the
    wrapped group's work, or raise the check's CollectiveMismatch or CollectiveFailure."""

    def __init__(self):
        super().__init__()
        self._issued = threading.Event()  # the check ran and the collective was issued, or failed
        self._gate = torch.futures.Future()  # completes with the wrapped work's value, or a _Failed
        self._work = None
        self._error = None

    def _issue(self, error, issue):
        """On the channel's worker, in the collective's turn: issue it when every rank agreed."""
        if error is None:
            try:
                self._work = issue()
            except Exception as e:  # noqa: BLE001 (the caller gets it at wait())
                error = e
        if error is not None:
            self._error = error
            self._issued.set()
            self._gate.set_result(_Failed(error))
            return
        self._issued.set()
        try:
            future = self._work.get_future()
        except RuntimeError:  # a work without a future: completed by waiting on it
            threading.Thread(target=self._complete_by_waiting, daemon=True).start()
            return
        future.then(self._complete)

    def _complete(self, future):
        try:
            self._gate.set_result(future.value())
        except Exception as e:  # noqa: BLE001 (the wrapped collective's own failure)
            self._gate.set_result(_Failed(e))

    def _complete_by_waiting(self):
        try:
            self._work.wait()
            self._gate.set_result(self._work.result())
        except Exception as e:  # noqa: BLE001
            self._gate.set_result(_Failed(e))

    def _raise_if_failed(self):
        self._issued.wait()
        if self._error is not None:
            raise self._error

    def wait(self, timeout=None):
        self._raise_if_failed()
        return self._work.wait() if timeout is None else self._work.wait(timeout)

    def get_future(self):
        return self._gate.then(_value_or_raise)

    def is_completed(self):
        return self._gate.done()

    def is_success(self):
        return self._gate.done() and not isinstance(self._gate.value(), _Failed)

    def exception(self):
        return self._error

    def result(self):
        self._raise_if_failed()
        return self._work.result()


def _all_reduce(self, *args, **kwargs):
    """ProcessGroup.allreduce, checked by lockstep's channel, then issued on the wrapped group; the common
    form (a list of tensors and AllreduceOptions: DDP's buckets, dist.all_reduce) goes through C++ alone."""
    if len(args) == 2 and not kwargs and isinstance(args[0], list) and isinstance(args[1], dist.AllreduceOptions):
        op, tensors = _op_all_reduce(args, args[1])
        tag, file, line = _call_site()
        work = self._channel.all_reduce_then(self._inner, tensors, args[1], op, tag, file, line,
                                             self._compare_call_sites)
        self._watch_backward(work)
        return work
    return self._checked_allreduce(*args, **kwargs)


def _checked_method(name, describe):
    def method(self, *args, **kwargs):
        opts = kwargs.get("opts", args[-1] if args and hasattr(args[-1], "timeout") else None)
        op, tensors = describe(args, opts)
        tag, file, line = _call_site()
        work = _CheckedWork()
        inner = self._inner
        self._watch_backward(work)
        self._channel.check_then(op, list(tensors), tag, file, line, self._compare_call_sites,
                                 lambda error: work._issue(error, lambda: getattr(inner, name)(*args, **kwargs)))
        return work

    method.__name__ = name
    method.__doc__ = f"ProcessGroup.{name}, checked by lockstep's channel, then issued on the wrapped group."
    return method


class CheckedProcessGroup(dist.ProcessGroup):
    """A torch.distributed ProcessGroup whose collectives are checked by lockstep's channel, then run
    by the wrapped group (`inner`). Every rank must wrap (a rendezvous over `store`). `global_ranks`: the
    members' ranks in the job, in the group's order, so that errors about a subgroup name both numberings."""

    def __init__(self, inner, store, timeout=_DEFAULT_TIMEOUT, compare_call_sites=False, global_ranks=(),
                 predict=True):
        super().__init__(inner.rank(), inner.size())
        self._inner = inner
        self._compare_call_sites = bool(compare_call_sites)
        self._backward_task = -1  # the backward whose collectives _watch_backward collects
        self._backward_works = []
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        rank, size = inner.rank(), inner.size()

        # The channel's own Gloo group: its fingerprint exchanges never queue behind the data it issues on
        # the wrapped group's backends.
        def make_gloo(prefix):
            return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size,
                                         datetime.timedelta(seconds=seconds))

        # `store` is this group's own, the same on every rank: one channel meets under it.
        self._channel = _C.LazyGroup(inner, store, seconds, "lockstep/checked", numbered=False, identity="",
                                     make_gloo=make_gloo, global_ranks=list(global_ranks), own_gloo=True,
                                     predict=bool(predict))
        self._channel.connect()  # heartbeats from now on, not from the first collective
        # Anything not checked here (send, recv, backend queries) reaches the inner group's backends.
        # torch looks the group's name up through its default backend (the first device's).
        for i, device in enumerate(inner._device_types):
            backend = inner._get_backend(device)
            kind = _BACKEND_TYPES.get(backend.name().lower(), dist.ProcessGroup.BackendType.CUSTOM)
            if i == 0:
                self._set_default_backend(kind)
            self._register_backend(torch.device(device.type if hasattr(device, "type") else device), kind, backend)

    def _watch_backward(self, work):
        """A collective issued inside a backward (DDP's buckets) completes a future that DDP's reducer
        reads: torch would report a failed check there as a RuntimeError naming the callback. The first
        one of each backward queues an autograd final callback, which runs before DDP's own and raises
        the check's error as it is (CollectiveMismatch, CollectiveFailure)."""
        task = torch._C._current_graph_task_id()
        if task == -1:
            return
        if task != self._backward_task:
            self._backward_task = task
            self._backward_works = []
            works = self._backward_works
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _raise_first_failure(works))
        self._backward_works.append(work)

    @property
    def inner(self):
        """The wrapped process group, which runs the collectives."""
        return self._inner

    def shutdown(self):
        """Destroying the wrapper leaves the wrapped group (whose backends it shares) working."""
        self._channel = _Closed()

    def abort(self):
        self._channel = _Closed()

    def getBackendName(self):  # noqa: N802 (torch's name)
        return BACKEND

    def name(self):
        return BACKEND


def _raise_first_failure(works):
    """A backward's final callback: raises the first failed check among its collectives."""
    for work in works:
        if isinstance(work, _CheckedWork):
            work._raise_if_failed()
        else:
            _C.raise_if_check_failed(work)


class _Closed:
    """The channel of a destroyed wrapper: a collective through it is an error, not a hang."""

    def check_then(self, op, *args):
        raise RuntimeError(f"lockstep.distributed: {op} on a process group that was destroyed")

    def all_reduce_then(self, inner, tensors, options, op, *args):
        self.check_then(op)


for _name, _describe in _CHECKED.items():
    setattr(CheckedProcessGroup, _name, _checked_method(_name, _describe))
CheckedProcessGroup._checked_allreduce = CheckedProcessGroup.allreduce
CheckedProcessGroup.allreduce = _all_reduce


def _timeout_of(group):
    """The timeout the group's backend was made with (Gloo's and NCCL's options hold it), else torch's
    default."""
    for device in group._device_types:
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return _DEFAULT_TIMEOUT


def _store_of(group):
    try:
        return dist.distributed_c10d._world.pg_map[group][1]
    except (AttributeError, KeyError):
        return dist.distributed_c10d._get_default_store()


def wrap(group=None, *, timeout=None, compare_call_sites=False, predict=True):
    """A CheckedProcessGroup over `group` (torch.distributed's default group when None): pass it to
    DistributedDataParallel(process_group=...) or as `group=` to collectives. Every rank of the group
    must call it, in the same order as its other wraps. `timeout`: how long a collective may wait for a
    stalled rank (default the group's, else 30 min). `compare_call_sites`: ranks must also issue each
    collective from the same API and function (off by default: ranks may legitimately reach one
    collective from different lines). `predict`: once the collectives repeat (a training loop), each is
    checked against the repetition on its own rank, with no exchange, and a rank whose call departs from
    it is named on every rank within about a second (docs/distributed.md, "Predicted checks"); False: every
    collective exchanges its fingerprint first (what the check cost before; kept for measuring)."""
    if not dist.is_initialized():
        raise RuntimeError("lockstep.distributed.wrap: torch.distributed is not initialized; call "
                           "dist.init_process_group first (or init it with backend='lockstep')")
    inner = group if group is not None else dist.group.WORLD
    if isinstance(inner, CheckedProcessGroup):
        return inner
    if timeout is None:
        timeout = _timeout_of(inner)
    store = _store_of(inner)
    # A wrapper without predictions meets under its own prefix, so that both kinds can wrap one group.
    prefix = f"lockstep/wrap/{inner.group_name}" + ("" if predict else "/exchange")
    checked = CheckedProcessGroup(inner, dist.PrefixStore(prefix, store), timeout, compare_call_sites,
                                  dist.get_process_group_ranks(inner), predict)
    _register(checked, inner, store)
    _WRAPPERS[inner.group_name] = weakref.ref(checked)
    return checked


# The wrappers made over each process group (by its name): a lockstep module over a wrapped group sends its
# own collectives through the wrapper's channel, whose worker issues everything on that group in one order.
_WRAPPERS = {}


def channel_of(group):
    """The checked channel that issues `group`'s collectives (a CheckedProcessGroup's, or the wrapper's made
    over `group`), else None: lockstep's modules then issue their own reductions through it."""
    if isinstance(group, CheckedProcessGroup):
        return group._channel
    wrapper = _WRAPPERS.get(getattr(group, "group_name", None))
    wrapper = wrapper() if wrapper is not None else None
    return wrapper._channel if wrapper is not None else None


def _register(checked, inner, store):
    """torch.distributed's functions look a group up in its world tables (its ranks, its backend's name),
    also when they report an error: the wrapper takes the inner group's entries."""
    world = dist.distributed_c10d._world
    world.pg_map[checked] = (BACKEND, store)
    world.pg_names[checked] = world.pg_names[inner]
    world.pg_group_ranks[checked] = world.pg_group_ranks[inner]
    world.pg_backend_config[checked] = world.pg_backend_config.get(inner, BACKEND)
    tag = world.pg_to_tag.get(inner, "")
    world.pg_to_tag[checked] = tag
    world.tags_to_pg.setdefault(tag, []).append(checked)


def _create_backend(store, rank, size, timeout):
    """torch.distributed's constructor for backend "lockstep": Gloo for CPU tensors and, where CUDA
    and NCCL are available, NCCL for CUDA tensors, under the checking wrapper."""
    inner = dist.ProcessGroup(store, rank, size)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
    inner._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    inner._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    if torch.cuda.is_available() and dist.is_nccl_available():
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size, options)
        inner._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
    return CheckedProcessGroup(inner, dist.PrefixStore("lockstep", store), timeout)


if BACKEND.upper() not in dist.Backend._plugins:  # importing twice (reloads) registers once
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu", "cuda"])

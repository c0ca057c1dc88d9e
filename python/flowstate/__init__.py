# Over 600 lines: the package's public surface (Pipeline, its Builder, Loader, sources, errors) in
# the one module `import flowstate` shows; the DataLoader and the workers have modules of their own.
"""flowstate from Python: exact, resumable input pipelines that hand PyTorch tensors over
without a copy.

    import flowstate
    pipeline = flowstate.Pipeline.from_yaml("pipeline.yaml", overrides={"shuffle.size": 1024})
    loader = flowstate.Loader(pipeline, epochs=2)
    for batch in loader:                  # a read-only mapping: field -> torch.Tensor
        train_step(batch["data"])         # shares flowstate's buffer (DLPack)
        if batch.info.is_last_in_epoch: ...
    torch.save({"loader": loader.state_dict(), ...}, "ckpt.pt")

Pipelines come from YAML, from a dict (the YAML document) or from the chained builder, which
is generated from the node registry (`flowstate.schema()`): every node, parameter, check and
error message is the one YAML and the `flowstate` command use. Python sequences and iterables
of any type are sources too (`from_sequence`, `from_iterable`), with Python `map`/`filter`
functions and a `collate`.
"""

import atexit
import collections
import dataclasses
import inspect
import json
import os
import warnings
from collections.abc import Mapping

from . import _flowstate as _C
from . import _workers
from ._state import __version__, describe_state  # the project's version; inspect for states

# The graphs' threads run Python callbacks: stop them before the interpreter finalizes.
atexit.register(_C.shutdown)
# ... and the worker processes first (atexit runs the last registered first).
atexit.register(_workers.close_all)

Error = _C.Error
ConfigError = _C.ConfigError
DataError = _C.DataError
CheckpointError = _C.CheckpointError

__all__ = [
    "Error", "ConfigError", "DataError", "CheckpointError", "schema", "Pipeline", "Builder",
    "Loader", "Batch", "BatchInfo", "GradientAccumulator", "from_sequence", "from_iterable",
    "default_collate", "describe_state",
]

#: Version of the dict state_dict() returns.
STATE_DICT_VERSION = 1


def schema():
    """Every node type a pipeline may name: a list of dicts with `type`, `doc`, `source` and
    `params` (each with name, type, default, doc, required, min, max, choices, free)."""
    return _C.schema()


def _node_types():
    return {s["type"]: s for s in _C.schema()}


# ---- collate ----

def default_collate(items):
    """PyTorch's default_collate (tensors, numpy arrays and numbers stack; dicts, tuples and
    lists collate per key / position), plus dataclass instances, which collate into a dict of
    their fields."""
    import torch.utils.data

    first = items[0]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return {f.name: default_collate([getattr(x, f.name) for x in items])
                for f in dataclasses.fields(first)}
    return torch.utils.data.default_collate(items)


def _map_tensors(value, fn):
    """`value` with fn(t) in place of every CPU torch.Tensor t in it, through dicts, lists and
    (named) tuples: how device_copy moves a Python source's collated batch."""
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value.detach()) if value.device.type == "cpu" else value
    if isinstance(value, Mapping):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


# ---- pipelines ----

def _yaml_value(v):
    # JSON is YAML: a value written as JSON reads back as the same value. `auto` (workers,
    # prefetch depth) and `inline` (workers) are written plain, as YAML users write them: a
    # quoted "auto" is a string that a count refuses, and a string parameter reads both the same.
    if isinstance(v, str) and v in ("auto", "inline"):
        return v
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_yaml_value(x)}"
                               for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    return json.dumps(v)


def _overrides(overrides):
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={_yaml_value(v)}" for k, v in overrides.items()]
    return [str(o) for o in overrides]


def _document_text(doc):
    """A pipeline document as YAML text, one node per line, so that messages point at it."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"a pipeline document is a dict, got {type(doc).__name__}")
    lines = []
    for key, value in doc.items():
        if key == "nodes" and isinstance(value, (list, tuple)):
            lines.append("nodes:")
            lines.extend("  - " + _yaml_value(n) for n in value)
            if not value:
                lines[-1] = "nodes: []"
        else:
            lines.append(f"{_yaml_value(key)}: {_yaml_value(value)}")
    return "\n".join(lines) + "\n"


class Pipeline:
    """An immutable, validated pipeline. Make one with from_yaml, from_dict or a builder."""

    def __init__(self, native, epochs=1, checkpoint=None, value_name=None):
        self._native = native
        self.epochs = epochs  #: the document's `epochs` (1 when it has none)
        self.checkpoint = checkpoint  #: the document's `checkpoint:` section, or None
        self._value_name = value_name
        self._plan = None  # a Python source's (_Plan)
        for w in native.warnings:
            warnings.warn(w, stacklevel=3)

    @classmethod
    def from_yaml(cls, path, overrides=None):
        """The pipeline of a YAML file; `overrides` maps keys ("shuffle.size",
        "nodes[1].shuffle.size", "seed") to values, like `flowstate run --set`. Raises
        ConfigError with the command's message (file:line:column: key: problem)."""
        native, epochs, ck = _C.load_yaml(os.fspath(path), True, os.fspath(path),
                                          _overrides(overrides), None, [])
        return cls(native, epochs, ck)

    @classmethod
    def from_dict(cls, doc, overrides=None, base_dir=None, origin="<dict>"):
        """The pipeline of a YAML document given as a dict ({"source": {...}, "nodes": [...]});
        relative paths resolve against `base_dir` (default: the current directory)."""
        return cls._load(doc, overrides, base_dir, origin, [], None)

    @classmethod
    def _load(cls, doc, overrides, base_dir, origin, python_nodes, value_name):
        text = _document_text(doc)
        native, epochs, ck = _C.load_yaml(text, False, origin, _overrides(overrides),
                                          None if base_dir is None else os.fspath(base_dir),
                                          python_nodes)
        return cls(native, epochs, ck, value_name)

    @property
    def fingerprint(self):
        """What must match between a checkpoint and the pipeline that restores it."""
        return self._native.fingerprint

    @property
    def warnings(self):
        return list(self._native.warnings)

    @property
    def node_names(self):
        return list(self._native.node_names)

    def canonical(self):
        """The pipeline without its free parameters: [("batch.size", "256"), ...]."""
        return list(self._native.canonical())

    def describe(self):
        return self._native.describe()

    def __repr__(self):
        return f"<flowstate.Pipeline {' -> '.join(self.node_names)}>"


class _PythonNode:
    """A Python object a pipeline node calls (a source, a map, a filter)."""

    def __init__(self, kind, **kw):
        self.kind = kind
        self.obj = self.fn = self.collate = self.size = self.length = None
        self.takes_epoch = self.resumable = False
        self.name = ""
        self.__dict__.update(kw)


def _takes_an_argument(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL):
            return True
    return False


class Builder:
    """A chained pipeline builder. Its node methods are generated from the registry
    (`flowstate.schema()`): `.shuffle(mode="buffer", size=1024)` is the YAML node
    `- shuffle: {mode: buffer, size: 1024}`, checked by the same code with the same messages.
    `map` and `filter` take a Python function (or a registered transform's name)."""

    def __init__(self):
        self._top = {}
        self._source = None
        self._nodes = []
        self._python = []
        self._value_name = None

    # -- top-level keys --
    def seed(self, seed):
        self._top["seed"] = seed
        return self

    def workers(self, workers):
        self._top["workers"] = workers
        return self

    def epochs(self, epochs):
        self._top["epochs"] = epochs
        return self

    # -- nodes --
    def _set_source(self, type_, params):
        if self._source is not None:
            raise ConfigError("a pipeline has one source; start a new builder")
        self._source = {"type": type_, **params}
        return self

    def add(self, type_, **params):
        """Adds a node by its registered type (also a plugin's)."""
        self._nodes.append({type_: params} if params else type_)
        return self

    def _python_ref(self, node):
        self._python.append(node)
        return len(self._python) - 1

    def map(self, fn, *, name=None, workers=None, **params):
        """A Python function on each sample (before batch): it returns the new sample. Or, with
        a string, a registered transform: `.map("decode", dtype="uint16")`."""
        if isinstance(fn, str):
            return self.add("map", fn=fn, **({"workers": workers} if workers else {}), **params)
        name = name or getattr(fn, "__qualname__", None) or "python_map"
        ref = self._python_ref(_PythonNode("map", fn=fn, name=name))
        node = {"ref": ref}
        if workers:
            node["workers"] = workers
        self._nodes.append({"python_map": node})
        return self

    def filter(self, fn, *, name=None, **params):
        """Keeps the samples for which a Python predicate is true (or a named predicate)."""
        if isinstance(fn, str):
            return self.add("filter", fn=fn, **params)
        name = name or getattr(fn, "__qualname__", None) or "python_filter"
        ref = self._python_ref(_PythonNode("filter", fn=fn, name=name))
        self._nodes.append({"python_filter": {"ref": ref}})
        return self

    def document(self):
        """The pipeline document this builder describes (Python objects as `ref`s)."""
        doc = dict(self._top)
        if self._source is not None:
            doc["source"] = self._source
        doc["nodes"] = list(self._nodes)
        return doc

    def build(self, base_dir=None):
        """Validates and returns the Pipeline (ConfigError naming the node otherwise)."""
        doc = self.document()
        source = doc.get("source") or {}
        if source.get("type") == "iterable" and "ref" in source:
            plan = _Plan(doc, self._python)
            p = Pipeline._load(plan.doc, None, base_dir, "<builder>", plan.python,
                               self._value_name)
            p._plan = plan
            return p
        return Pipeline._load(doc, None, base_dir, "<builder>", self._python, self._value_name)

    def loader(self, **kwargs):
        """Loader(self.build(), **kwargs)."""
        return Loader(self.build(), **kwargs)

    def __getattr__(self, name):
        # A node type registered after import (a plugin loaded since).
        if not name.startswith("_"):
            spec = _node_types().get(name)
            if spec is not None and not spec["source"]:
                return lambda **params: self.add(name, **params)
        raise AttributeError(f"'Builder' has no node '{name}' (flowstate.schema() lists them)")


def _param_doc(spec):
    lines = [spec["doc"], ""]
    for p in spec["params"]:
        default = "required" if p["required"] else (
            f"default {p['default']!r}" if p["default"] is not None else p["default_doc"] or "unset")
        lines.append(f"  {p['name']} ({p['type']}; {default}): {p['doc']}")
        for f in p.get("fields", ()):  # a map's keys: cache={"dir": ..., "limit": ...}
            sub = f"default {f['default']!r}" if f["default"] is not None else (
                f["default_doc"] or "unset")
            lines.append(f"    {p['name']}[{f['name']!r}] ({f['type']}; {sub}): {f['doc']}")
    return "\n".join(lines)


def _generate():
    """Builder methods and module-level source functions, one per registered node type, each
    with its real signature: the schema's parameters as typed keyword-only arguments with
    their defaults (what inspect.signature, help() and the typed stubs show; the values are
    still checked by the YAML loader, with its messages)."""
    import keyword
    import typing

    kinds = _C.param_kinds()
    # A parameter that takes the word `auto` takes it from Python only when the document the
    # builder writes has it plain (YAML's quoted "auto" is a string, which they refuse).
    writes_auto = _yaml_value("auto") == "auto"
    types = {"bool": bool, "uint": int, "int": int, "float": float, "string": str,
             "string_list": typing.Union[str, list[str]],
             "int_list": typing.Union[int, list[int]],
             "map": dict}

    def parameter(p, kind):
        annotation = types.get(kind["kind"], typing.Any)
        if p["choices"]:
            annotation = typing.Literal[tuple(p["choices"])]
        if kind["auto"] and writes_auto:
            annotation = typing.Union[annotation, typing.Literal["auto"]]
        default = inspect.Parameter.empty
        if not p["required"]:
            default = p["default"]
            if default is None:
                annotation = typing.Optional[annotation]
        return inspect.Parameter(p["name"], inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=annotation)

    def signature(spec, first):
        params = [parameter(p, kinds[spec["type"]][p["name"]]) for p in spec["params"]
                  if p["name"].isidentifier() and not keyword.iskeyword(p["name"])]
        # Required ones first, for the reader (keyword-only: any order is valid).
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
        return inspect.Signature(first + params, return_annotation=Builder)

    def source(t):
        def start(**params):
            return Builder()._set_source(t, params)
        return start

    def node(t):
        def method(self, **params):
            return self.add(t, **params)
        return method

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for spec in _C.schema():
        t = spec["type"]
        if spec["source"]:
            start = source(t)
            start.__name__ = start.__qualname__ = t
            start.__doc__ = f"Starts a builder with the `{t}` source: " + _param_doc(spec)
            start.__signature__ = signature(spec, [])
            globals()[t] = start
            __all__.append(t)
        elif t not in ("map", "filter"):
            method = node(t)
            method.__name__ = t
            method.__qualname__ = f"Builder.{t}"
            method.__doc__ = _param_doc(spec)
            method.__signature__ = signature(spec, [self_param])
            setattr(Builder, t, method)


_generate()


def from_sequence(seq, name=None, collate=None):
    """A builder whose source is `seq`, anything with __len__ and __getitem__ (items of any
    type): resumes in O(1) by index; shuffle and shard apply. `collate(list_of_items)` makes
    a batch (default: default_collate). `name` stands for the data in the fingerprint."""
    if not name:
        raise ConfigError("from_sequence needs name=...: a Python sequence cannot be hashed, so "
                          "its name stands for the data in the fingerprint")
    b = Builder()
    ref = b._python_ref(_PythonNode("sequence", obj=seq, name=name, length=len(seq),
                                    collate=collate or default_collate))
    b._value_name = name
    return b._set_source("iterable", {"ref": ref})


def from_iterable(factory, name=None, collate=None, size=None, resumable=None):
    """A builder whose source is the iterable `factory()` returns (or `factory(epoch)` when it
    takes an argument), made afresh every epoch. When that object has state_dict() and
    load_state_dict(), a resume is exact through them (the state is pickled into every
    batch's stamp: keep it small); otherwise a resume replays the epoch from its start (a
    warning says so). `resumable` overrides the detection, which calls the factory once.
    `size`: items per epoch, when known."""
    if not name:
        raise ConfigError("from_iterable needs name=...: an iterable cannot be hashed, so its "
                          "name stands for the data in the fingerprint")
    takes_epoch = _takes_an_argument(factory)
    if resumable is None:
        probe = factory(0) if takes_epoch else factory()
        resumable = hasattr(probe, "state_dict") and hasattr(probe, "load_state_dict")
        del probe
    b = Builder()
    ref = b._python_ref(_PythonNode("iterable", obj=factory, name=name, size=size,
                                    takes_epoch=takes_epoch, resumable=bool(resumable),
                                    collate=collate or default_collate))
    b._value_name = name
    return b._set_source("iterable", {"ref": ref})


# ---- batches and the loader ----

class BatchInfo(collections.namedtuple("BatchInfo", [
        "step", "epoch", "index_in_epoch", "batches_in_epoch", "is_last_in_epoch",
        "num_samples", "remainder", "padding"])):
    """What a trainer needs to know about a batch, known before it is handed out (read-only):
    step (global: counts every scheduled batch, across epochs and restarts), epoch (0-based),
    index_in_epoch (0-based position in the epoch's schedule), batches_in_epoch (None when
    unknown), is_last_in_epoch (no later batch of this epoch will be delivered), num_samples,
    remainder (valid samples of a short last batch; 0 when full), padding (samples that repeat
    a record so that every rank takes the same number of steps: shard's `uneven: pad`)."""
    __slots__ = ()


class Batch(Mapping):
    """A read-only mapping field name -> torch.Tensor. Tensor fields share flowstate's buffer
    (DLPack: no copy; the buffer lives as long as any tensor viewing it). For a Python source,
    `value` is what collate returned; a dict is the mapping, anything else is the one field
    named after the source.

    With `device_copy` to a CUDA device, the batch is handed over to PyTorch's current stream
    (on the batch's device) when the loader returns it: that stream waits on the copy
    (cudaStreamWaitEvent), the host does not, and the pool reuses the batch's device memory
    only after the work that stream had queued when the last tensor on it was dropped. Use
    the tensors on that stream, or call `wait(stream)` before using them on another one;
    `wait()` blocks until the copy is complete. `dlpack(name)` is the field as a DLPack
    producer for other consumers (`torch.utils.dlpack.from_dlpack`, CuPy, JAX): its
    `__dlpack__(stream=...)` makes the consumer's stream wait the same way."""

    __slots__ = ("info", "value", "_fields", "_producers", "_fence")

    def __init__(self, info, fields, value, producers=None, fence=None):
        self.info = info
        self.value = value
        self._fields = fields
        self._producers = producers or {}
        self._fence = fence

    def wait(self, stream=None):
        """Without `stream`, blocks until the batch's device copy is complete; with one (a
        torch.cuda.Stream or its `cuda_stream` handle), makes that stream's later work wait for
        the copy, without blocking, and orders the reuse of the batch's device memory after
        it. A no-op for a batch in host memory."""
        if self._fence is not None:
            self._fence.wait(stream)

    def dlpack(self, name):
        """The tensor field `name` as an object with `__dlpack__(stream=None)` and
        `__dlpack_device__()`. `__dlpack__` with a stream makes it wait for the copy; without
        one (None) it blocks until the copy is complete."""
        return self._producers[name]

    def __getitem__(self, key):
        return self._fields[key]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self):
        return len(self._fields)

    def __repr__(self):
        return f"<flowstate.Batch step={self.info.step} fields={list(self._fields)}>"


class _TorchCoordinator:
    """The ranks of a torch.distributed process group as flowstate's Coordinator: with it,
    Loader.save_checkpoint and Loader.restore are collective -- one step-N holding every rank's
    part, committed for all ranks at once, and a restore every rank agrees on. Every rank must
    call them at the same steps. Any backend works (gloo on CPU); messages are a few KiB."""

    def __init__(self, group):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise ConfigError("process_group: torch.distributed is not initialized "
                              "(call torch.distributed.init_process_group first)")
        self._dist = dist
        self._group = group
        self._rank = dist.get_rank(group)
        self._world = dist.get_world_size(group)

    def rank(self):
        return self._rank

    def world(self):
        return self._world

    def all_gather(self, message):
        out = [None] * self._world
        self._dist.all_gather_object(out, bytes(message), group=self._group)
        return out

    def barrier(self):
        self._dist.barrier(group=self._group)


class _Plan:
    """How a pipeline with a Python source runs (flowstate/_workers.py): the document the C++
    graph plans its batches with -- the source as its indices (a sequence) or its items (an
    iterable), the Python maps in place as no-ops, a Python filter reading its item through
    the Program, no device_copy (the Python side moves the batch) -- and the Program that
    makes each planned batch."""

    def __init__(self, doc, python):
        src = python[doc["source"]["ref"]]
        plan = list(python)
        maps, device, nodes = [], None, []
        program = _workers.Program(src.obj if src.kind == "sequence" else None, [], src.collate,
                                   doc.get("seed", 0) or 0, src.name)
        for node in doc["nodes"]:
            kind = next(iter(node)) if isinstance(node, Mapping) else node
            params = node[kind] if isinstance(node, Mapping) else {}
            if kind == "python_map":
                spec = python[params["ref"]]
                maps.append((spec.name, spec.fn))
                plan[params["ref"]] = _PythonNode("map", fn=None, name=spec.name)
            elif kind == "python_filter":
                spec = python[params["ref"]]
                plan[params["ref"]] = _PythonNode(
                    "filter", name=spec.name,
                    fn=lambda key, f=spec.fn, m=len(maps): f(program.item(key, m)))
            elif kind == "device_copy":
                device = (params or {}).get("device", "auto")
                continue
            nodes.append(node)
        program.maps = maps
        if src.kind == "sequence":
            plan[doc["source"]["ref"]] = _PythonNode("indices", name=src.name, length=src.length)
        else:
            plan[doc["source"]["ref"]] = _PythonNode(
                "items", obj=src.obj, name=src.name, size=src.size, takes_epoch=src.takes_epoch,
                resumable=src.resumable)
        self.program = program
        self.device = device
        self.indices = src.kind == "sequence"
        self.doc = dict(doc, nodes=nodes)
        self.python = plan


def _workers_option(workers):
    """`workers` as the native loader takes it: None, a count >= 1, 0 for "auto" or -1 for
    "inline"."""
    if workers is None:
        return None
    if workers == "auto":
        return 0
    if workers == "inline":
        return -1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r}: threads assembling batches: 1, 2, ..., "
                          "\"auto\" (tuned while running) or \"inline\" (on the calling "
                          "thread, in next()). For the Python parts of a Python "
                          "source, num_workers=N runs N worker processes (0: the calling "
                          "process)")
    return workers


def _job_options(checkpoint_dir, cache_dir, cache_limit):
    """Loader's checkpoint_dir, cache_dir and cache_limit as the native Loader takes them."""
    limit = 0
    if cache_limit is not None:
        if isinstance(cache_limit, bool) or not isinstance(cache_limit, (int, str)):
            raise ConfigError(f"cache_limit={cache_limit!r}: bytes, or a size like '20GiB'")
        if isinstance(cache_limit, int):
            if cache_limit <= 0:
                raise ConfigError(f"cache_limit={cache_limit!r}: must be more than 0 bytes")
            limit = cache_limit
        else:
            limit = _C.parse_byte_size(cache_limit, "cache_limit")
            if limit == 0:
                raise ConfigError(f"cache_limit={cache_limit!r}: must be more than 0 bytes")
    return {"checkpoint_dir": "" if checkpoint_dir is None else os.path.abspath(checkpoint_dir),
            "cache_dir": "" if cache_dir is None else os.path.abspath(cache_dir),
            "cache_limit": limit}


def _device_of(device):
    import torch

    if device in (None, "auto"):
        if not torch.cuda.is_available():
            return None
        rank = os.environ.get("LOCAL_RANK", "0")
        return torch.device(f"cuda:{rank}")
    if device in ("host", "cpu", "pinned"):
        return None
    return torch.device(device)


class _Pending:
    """A planned batch whose Python task may still run: its info, its plan state, and the
    task's payload (or its result, once taken)."""

    __slots__ = ("info", "state", "payload", "ident", "value", "submitted")

    def __init__(self, info, state, payload, ident):
        self.info, self.state, self.payload, self.ident = info, state, payload, ident
        self.value, self.submitted = None, False


def _data_changed(value):
    """load_state_dict's `data_changed`: "refuse" (the default) or "continue"."""
    if value not in ("refuse", "continue"):
        raise ConfigError(f"data_changed={value!r}: 'refuse' (the default) or 'continue'")
    return value == "continue"


class Loader:
    """Runs a Pipeline, one epoch per iteration, as torch's DataLoader does: `for batch in
    loader` yields the batches of one epoch (each a Batch), and iterating again continues with
    the next epoch. `len(loader)` is the batches of one epoch (of this rank), `loader.epoch`
    the epoch the next iteration yields. Breaking out of an epoch and iterating again continues
    that epoch where it stopped (as a resumed state does). `next(loader)` is the next batch of
    the whole run, across epochs.

    `epochs`: how many epochs the loader runs at most; None (the default) runs as many as you
    iterate. (A document's `epochs:` is what `flowstate run` runs, `pipeline.epochs`: pass
    epochs=pipeline.epochs for that bound.) An iteration after the last epoch raises Error,
    never an empty loop. `workers` (threads assembling batches, or "auto") and `prefetch`
    never change the batches, so a state saved with one count restores with another. Waiting
    for a batch releases the GIL.

    A pipeline whose source is Python (from_sequence, from_iterable) runs its Python parts --
    `__getitem__`, Python maps, collate -- in `num_workers` worker processes (0, the default:
    in the calling process), with tensors coming back through shared memory; see
    flowstate/_workers.py. The batches are the same for any num_workers, and a state saved
    with one restores with another. `prefetch_factor` (batches in flight per worker),
    `timeout` (seconds to wait for a worker's batch; 0: no limit), `worker_init_fn` and
    `pin_memory` are torch's.

    `process_group` (a torch.distributed group, e.g. torch.distributed.group.WORLD) makes
    save_checkpoint and restore collective over its ranks: one checkpoint step for all of
    them, committed only when every rank's part is durable (see _TorchCoordinator).

    `checkpoint_dir`: the job's checkpoint directory (the one you pass to save_checkpoint and
    restore). Remote sources (s3://, http(s)://) save their listing in its `listings/` and
    every Loader on it -- a resumed one, len()'s probe -- reads it instead of listing the
    store again: a job lists once. `cache_dir` and `cache_limit` (bytes, or a size like
    "20GiB") are the job's defaults for the sources' local cache of remote objects, over
    FLOWSTATE_CACHE_DIR and FLOWSTATE_CACHE_LIMIT; a source's `cache` option is over them.
    None of the three changes the batches."""

    def __init__(self, pipeline, epochs=None, workers=None, prefetch=None, process_group=None,
                 num_workers=0, prefetch_factor=None, timeout=0, worker_init_fn=None,
                 pin_memory=False, checkpoint_dir=None, cache_dir=None, cache_limit=None,
                 _pool=None):
        if isinstance(pipeline, Builder):
            pipeline = pipeline.build()
        self.pipeline = pipeline
        if epochs is None:
            epochs = 0
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ConfigError(f"epochs={epochs!r}: a count of epochs, or None to run as many "
                              "as you iterate")
        self.epochs = epochs
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r}: worker processes for the Python "
                              "parts, 0 (the calling process) or more")
        self._plan = pipeline._plan
        if num_workers and self._plan is None:
            raise ConfigError("num_workers: worker processes run the Python parts of a Python "
                              "source (from_sequence, from_iterable); this pipeline's source "
                              "is read by flowstate's threads: use workers=N for those")
        if prefetch_factor is not None and not num_workers:
            raise ConfigError("prefetch_factor applies to worker processes (num_workers > 0)")
        self.num_workers = num_workers
        self._in_flight = num_workers * (2 if prefetch_factor is None else prefetch_factor)
        self._timeout = timeout
        self._worker_init_fn = worker_init_fn
        self._pin = bool(pin_memory)
        self._owns_pool = _pool is None
        self._pool = _pool
        coordinator = None if process_group is None else _TorchCoordinator(process_group)
        self._job = _job_options(checkpoint_dir, cache_dir, cache_limit)
        self._native = _C.Loader(pipeline._native, self.epochs,
                                 _workers_option(workers), prefetch, coordinator, **self._job)
        self._device = _device_of(self._plan.device) if self._plan else None
        if self._pin:
            import torch
            if not torch.cuda.is_available():
                warnings.warn("pin_memory=True, but no CUDA device is available: batches stay "
                              "in ordinary memory", stacklevel=2)
                self._pin = False
        self._len = None
        self._pending = collections.deque()
        self._ident = 0
        self._state = None           # the plan's state after the last delivered batch
        self._epoch = 0              # the epoch the next iteration yields
        self._ended = False          # the native loader has no more batches
        self._closed = False

    # -- iteration, one epoch at a time --
    @property
    def epoch(self):
        """The epoch the next (or the current) iteration yields, 0-based."""
        return self._epoch

    def set_epoch(self, epoch):
        """torch's convention, kept so that `loader.set_epoch(epoch)` loops run unchanged. The
        native Loader's epochs follow each other (an epoch continues the state of the one
        before: a buffer shuffle's, an iterable's), so `epoch` must be the one the next
        iteration yields (loader.epoch) -- e.g. the epoch of a loaded state_dict.
        flowstate.DataLoader takes any epoch."""
        self._check_open()
        if epoch != self._epoch:
            raise Error(f"set_epoch({epoch}): this Loader's next epoch is {self._epoch}; its "
                        "epochs follow each other (load a state_dict to continue elsewhere, or "
                        "use flowstate.DataLoader, whose set_epoch takes any epoch)")

    def __iter__(self):
        self._check_open()
        if self.epochs and self._epoch >= self.epochs:
            raise Error(f"this Loader ran its {self.epochs} epoch(s) (epochs={self.epochs}); "
                        "make it with epochs=None to run as many epochs as you iterate")
        return self._epoch_batches()

    def _epoch_batches(self):
        while True:
            b = self._next_batch()
            if b is None:
                if self.epochs:
                    self._epoch = self.epochs
                return
            yield b
            if b.info.is_last_in_epoch:
                self._epoch = b.info.epoch + 1
                return

    def __next__(self):
        """The next batch of the whole run, across epochs (the C++ Loader's next()):
        StopIteration only after the last epoch. A `for` loop takes one epoch."""
        b = self._next_batch()
        if b is None:
            if self.epochs:
                self._epoch = self.epochs
            raise StopIteration
        self._epoch = b.info.epoch + (1 if b.info.is_last_in_epoch else 0)
        return b

    def _drop(self, p):
        if p.submitted and self._pool is not None:
            try:
                self._pool.result(p.ident)
            except Exception:
                pass

    # -- batches --
    def _plan_next(self, peek=False):
        """The next planned batch as a _Pending, or None after the last epoch. A plan's batch
        carries its task's payload and the plan's state after it; a batch of a pipeline
        without a Python source is made already (its state is kept only when peeked at)."""
        if self._ended:
            return None
        keep_state = self._plan is not None or peek
        if keep_state and self._state is None:
            self._state = self._native.state()  # what was delivered so far
        parts = self._native.next()
        if parts is None:
            self._ended = True
            return None
        info, fields, value, producers, fence = parts
        info = BatchInfo._make(info)
        state = self._native.state() if keep_state else None
        if self._plan is None:
            b = _Pending(info, state, None, None)
            if value is not None:
                fields = (dict(value) if isinstance(value, Mapping)
                          else {self.pipeline._value_name: value})
            b.value = Batch(info, fields, value, producers, fence)
            return b
        payload = value.tolist() if self._plan.indices else value
        self._ident += 1
        return _Pending(info, state, payload, self._ident)

    def _submit(self, p):
        seed = _workers.task_seed(self._plan.program.seed, p.info.epoch, p.info.step)
        where = (f"step {p.info.step} (epoch {p.info.epoch}, "
                 + (f"items {p.payload}" if self._plan.indices else f"{len(p.payload)} items")
                 + ")")
        self._pool.submit(p.ident, p.payload, seed, where)
        p.submitted = True

    def _fill(self):
        while len(self._pending) < self._in_flight:
            p = self._plan_next()
            if p is None:
                return
            self._submit(p)
            self._pending.append(p)

    def _next_batch(self):
        self._check_open()
        if self._plan is None:
            p = self._pending.popleft() if self._pending else self._plan_next()
            if p is None:
                return None
            self._state = p.state  # None: the native loader's own state is this batch's
            return p.value
        if self.num_workers:
            if self._pool is None:
                self._pool = _workers.Pool(self._plan.program, self.num_workers,
                                           self._worker_init_fn, self._timeout)
            for p in self._pending:
                if p.ident is not None and not p.submitted:
                    self._submit(p)
            self._fill()
            if not self._pending:
                return None
            p = self._pending.popleft()
            value = self._pool.result(p.ident)
            self._fill()
        else:
            p = self._pending.popleft() if self._pending else self._plan_next()
            if p is None:
                return None
            seed = _workers.task_seed(self._plan.program.seed, p.info.epoch, p.info.step)
            value = _workers.run_here(self._plan.program, p.payload, seed)
        self._state = p.state
        return self._batch(p.info, value)

    def _batch(self, info, value):
        if self._pin:
            value = _map_tensors(value, lambda t: t.pin_memory())
        if self._device is not None:
            value = _map_tensors(value, lambda t: t.to(self._device, non_blocking=self._pin))
        fields = dict(value) if isinstance(value, Mapping) else {self.pipeline._value_name: value}
        return Batch(info, fields, value)

    def __len__(self):
        """Batches in one epoch (of this rank), when the epoch's length is known: torch's
        len(DataLoader). The first call plans one batch on a separate loader to learn it."""
        self._check_open()
        if self._len is None:
            # The job's options: with a checkpoint_dir, the probe reads the saved listing.
            probe = _C.Loader(self.pipeline._native, 1, 1, 1, None, **self._job)
            parts = probe.next()
            del probe
            per_epoch = 0 if parts is None else BatchInfo._make(parts[0]).batches_in_epoch
            if per_epoch is None:
                raise TypeError("len() of a loader whose epoch length is unknown (a source of "
                                "unknown size, a filter, pack or mix)")
            self._len = per_epoch
        return self._len

    # -- state --
    def _reset_pending(self):
        while self._pending:
            self._drop(self._pending.popleft())
        self._ended = False
        self._state = None
        self._iter = None

    def _after_load(self):
        """After a load or restore: the next batch is planned now (peeked at), so that
        loader.epoch says which epoch the next iteration continues."""
        fields = _C.state_fields(self._native.state())
        p = self._plan_next(peek=True)
        if p is not None:
            self._pending.append(p)
            self._epoch = p.info.epoch
        else:
            self._epoch = (fields["epoch"] or 0) + 1

    def state(self):
        """The encoded state after the last batch received (bytes)."""
        self._check_open()
        return self._state if self._state is not None else self._native.state()

    def load_state(self, state, data_changed="refuse"):
        self._check_open()
        cont = _data_changed(data_changed)
        self._reset_pending()
        self._native.load_state(bytes(state), cont)
        self._after_load()

    def state_dict(self):
        """A small picklable dict (torchdata StatefulDataLoader's contract): the state after the
        last batch received, plus readable fields. Store it with torch.save next to the model
        and optimizer; load_state_dict() on a loader of the same pipeline continues with the
        next batch exactly, with any number of workers or worker processes."""
        self._check_open()
        state = self.state()
        d = {"version": STATE_DICT_VERSION, "state": state}
        d.update(_C.state_fields(state))
        return d

    def load_state_dict(self, state_dict, data_changed="refuse"):
        """Continues from state_dict(). Raises CheckpointError naming what differs when it was
        saved by a pipeline whose output differs, or what is missing when it is not one.
        data_changed="continue" continues over a pipeline that differs only in data
        parameters (a mix's weights or inputs), or over files added to or removed from a
        source's glob (added: from the next epoch; removed: their unread records of this epoch
        skipped), by each node's rule (docs/DECISIONS.md); the change is recorded in
        `data_changes`."""
        self._check_open()
        _data_changed(data_changed)
        if not isinstance(state_dict, Mapping):
            raise CheckpointError(f"state_dict: expected a dict, got {type(state_dict).__name__}")
        for key in ("version", "state", "fingerprint"):
            if key not in state_dict:
                raise CheckpointError(f"state_dict: missing '{key}' (not a flowstate state_dict)")
        if state_dict["version"] != STATE_DICT_VERSION:
            raise CheckpointError(f"state_dict: version {state_dict['version']} is not "
                                  f"{STATE_DICT_VERSION}; upgrade flowstate")
        # The encoded state carries the canonical description: a different pipeline is
        # refused there, with every differing field named.
        self.load_state(state_dict["state"], data_changed)

    def set_mix_weights(self, node, weights):
        """From the next batch on, mix `node` draws with `weights` (one positive number per
        input); every input keeps its position. The weights in force are part of the state,
        and the change is recorded in `data_changes`."""
        self._check_open()
        weights = [float(w) for w in weights]
        if self._pending:
            # Planned ahead: plan again from the last delivered batch, with the new weights.
            state = self.state()
            self._reset_pending()
            self._native.load_state(state)
            self._native.set_mix_weights(node, weights)
            self._after_load()
            return
        self._native.set_mix_weights(node, weights)

    @property
    def data_changes(self):
        """The run's data changes, oldest first: (step, what) tuples, as in the state."""
        self._check_open()
        return self._native.data_changes()

    def skip(self, first, last):
        """Drops steps [first, last] (inclusive) without reading them; part of the state."""
        self._check_open()
        if self._pending:
            # Planned ahead (a peek after a load, or tasks in flight): plan again from the
            # last delivered batch, with the skip.
            state = self.state()
            self._reset_pending()
            self._native.load_state(state)
            self._native.skip(first, last)
            self._after_load()
            return
        self._native.skip(first, last)

    def save_checkpoint(self, directory, keep=3, overwrite=False):
        """Writes the state as a checkpoint under `directory` (atomic, three fsyncs); returns
        the step directory. keep: newest checkpoints kept (0: all)."""
        self._check_open()
        if self._state is not None:
            return self._native.save_state_checkpoint(os.fspath(directory), self._state, keep,
                                                      overwrite)
        return self._native.save_checkpoint(os.fspath(directory), keep, overwrite)

    def restore(self, directory):
        """Continues from the newest checkpoint under `directory` that verifies; returns
        {path, step, skipped} or None for a fresh start (no evidence of checkpoints)."""
        self._check_open()
        self._reset_pending()
        found = self._native.restore(os.fspath(directory))
        if found is not None:
            self._after_load()
        return found

    def stats(self):
        """Where time went: per-stage items and busy time, consumer and graph waits."""
        self._check_open()
        return self._native.stats()

    @property
    def fingerprint(self):
        self._check_open()
        return self._native.fingerprint

    def _check_open(self):
        if self._closed:
            raise Error("this flowstate.Loader is closed")

    def close(self):
        """Stops the graph and the worker processes now (also mid-epoch). Tensors handed out
        stay valid; every later call raises flowstate.Error."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None and self._owns_pool:
            self._pool.close()
        self._pool = None
        self._pending.clear()
        self._native = None

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None and getattr(self, "_owns_pool", False):
            pool.close()


class GradientAccumulator:
    """Gradient accumulation over `steps` batches per optimizer step: sync_gradients(batch)
    is true at every steps-th batch of an epoch and at the epoch's last batch (a short window
    is stepped, not carried over). A pure function of batch.info, so it stays right after a
    resume in the middle of a window. `batch_size` (the batch node's) makes loss_scale and
    step_scale exact for a short last batch."""

    def __init__(self, steps, batch_size=1):
        self.steps = steps
        self._native = _C.GradientAccumulator(steps, batch_size)

    @staticmethod
    def _info(batch):
        info = batch.info if isinstance(batch, Batch) else batch
        return info.index_in_epoch, info.is_last_in_epoch, info.num_samples

    def sync_gradients(self, batch):
        """True when the optimizer steps after this batch (a Batch or its BatchInfo)."""
        return self._native.step_after(*self._info(batch))

    def loss_scale(self, batch):
        """Factor for this batch's mean loss: num_samples / (steps * batch_size)."""
        return self._native.loss_scale(*self._info(batch))

    def step_scale(self, batch):
        """Factor for the accumulated gradients before the step: 1 for a full window."""
        return self._native.step_scale(*self._info(batch))


from ._dataloader import DataLoader  # noqa: E402 -- built on the names above
from ._workers import WorkerInfo, get_worker_info  # noqa: E402

__all__ += ["DataLoader", "WorkerInfo", "get_worker_info"]

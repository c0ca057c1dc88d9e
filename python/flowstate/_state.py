"""The package's version and what a saved state holds (flowstate.__version__,
flowstate.describe_state); __init__.py imports both."""

import json as _json
import typing
from collections.abc import Mapping

from . import _flowstate as _C

#: The project's one version (`project(flowstate VERSION ...)` in CMakeLists.txt), the one
#: `flowstate --version` prints.
__version__ = _C.__version__


def _fields_json(state_dict):
    """The state_dict's fields other than the state bytes, as a JSON object (text): shown as
    they are (a value JSON cannot hold as its repr)."""
    fields = {str(k): v for k, v in state_dict.items() if k != "state"}
    return _json.dumps(fields, default=repr)


def describe_state(state: typing.Union[bytes, Mapping[str, typing.Any]],
                   json: bool = False) -> typing.Union[str, dict]:
    """What `flowstate inspect` shows for a checkpoint directory, for a saved state: `state` is
    the bytes of Loader.state(), or a dict of state_dict() (its "state" holds the bytes; its
    other fields, a DataLoader's epoch say, are shown as they are). Returns the text
    `flowstate inspect` prints; with json=True the object `flowstate inspect --json` prints,
    as a dict. Raises CheckpointError when the bytes are not a flowstate state.

        print(flowstate.describe_state(torch.load("train.pt")["loader"]))"""
    fields = ""
    if isinstance(state, Mapping):
        if "state" not in state:
            raise _C.CheckpointError("describe_state: the dict has no 'state' (not a flowstate "
                                     "state_dict)")
        fields = _fields_json(state)
        state = state["state"]
    if not isinstance(state, (bytes, bytearray, memoryview)):
        raise _C.CheckpointError("describe_state: expected the bytes of Loader.state() or a "
                                 f"state_dict, got {type(state).__name__}")
    description = _C.describe_state(bytes(state), fields)
    if json:
        return _json.loads(description)
    return _C.render_state_description(description)

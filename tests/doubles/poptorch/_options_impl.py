# ruff: noqa: N802, FBT003 - PopTorch's own method names and calls, kept as programs see them
"""
A test double of PopTorch's ``OptionsDict`` (``python/_options_impl.py``).

Follows graphcore/poptorch at the tags sdk/poptorch/2.4.0 to sdk/poptorch/3.4.0, where
``OptionsDict`` behaves identically (3.0.0 only added ``__repr__``). Written for these tests, not
copied: the same rules, in the same order, with the same messages:

- ``opts.name = value`` for a public name is ``set(name=value)``: an ``AssertionError``
  "Invalid option NAME, valid options are dict_keys([...])" unless ``name`` was given to the
  constructor, and "Unexpected type ..." when the value's type differs from the default's;
- a private name (``_x``) can be set only while ``_values`` does not exist yet (in ``__init__``)
  or when it already exists: otherwise ``AttributeError("Invalid private attribute _x. ...")``;
- a frozen object refuses every change with ``AttributeError("Can't modify frozen Options")``;
- reading an unknown name is ``AttributeError("Invalid attribute NAME.")``;
- ``deepcopy`` rebuilds through ``__setattr__`` and gives an unfrozen copy.
"""

import copy


class OptionsDict:
    """Options that can only be updated under the names given to the constructor."""

    def __init__(self, **default_values):
        self._warnings = {}
        self._warnings_disabled = set()
        self._is_frozen = False
        self._values = default_values  # last: from here on no new private attribute

    def set(self, **kwargs):
        self.checkIsFrozen()
        for option, value in kwargs.items():
            assert self.exists(option), f"Invalid option {option}, valid options are {self._values.keys()}"
            expected = type(self._values[option])
            assert isinstance(value, expected), (
                f"Unexpected type {type(value)} for option {option}. Expected {expected}")
            self._values[option] = value

    def createOrSet(self, **kwargs):
        self.checkIsFrozen()
        for option, value in kwargs.items():
            if option in self._values:
                self.set(**{option: value})
            else:
                self._values[option] = value

    def exists(self, option):
        return option in self._values

    def _hasattr(self, option):
        if option == "__class__":
            return True
        if option.startswith("_"):
            return option in self.__dict__
        return self.exists(option)

    def _changeFreezeState(self, new_state):
        self._is_frozen = new_state
        for value in self.__dict__.values():
            if isinstance(value, OptionsDict):
                if value._hasattr("_is_frozen"):
                    value._is_frozen = new_state
            elif hasattr(value, "_is_frozen"):
                value._is_frozen = new_state

    def _freeze(self):
        self._changeFreezeState(True)

    def _unfreeze(self):
        self._changeFreezeState(False)

    def checkIsFrozen(self, option=None):
        if self._hasattr("_is_frozen") and option != "_is_frozen" and self._is_frozen:
            raise AttributeError("Can't modify frozen Options")

    def __deepcopy__(self, memory):
        cls = self.__class__
        copied = cls.__new__(cls)
        memory[id(self)] = copied
        for key, value in self.__dict__.items():
            setattr(copied, key, False if key == "_is_frozen" else copy.deepcopy(value, memory))
        return copied

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __setattr__(self, option, value):
        self.checkIsFrozen(option)
        if not option.startswith("_"):
            self.set(**{option: value})
            return
        if self._hasattr("_values") and not self._hasattr(option):
            raise AttributeError(f"Invalid private attribute {option}. Valid attributes: {list(self.__dict__)}")
        super().__setattr__(option, value)

    def __getattr__(self, option):
        if not self._hasattr(option):
            raise AttributeError(f"Invalid attribute {option}.")
        if option.startswith("_"):
            return self.__dict__[option]
        return self._values[option]

    def update(self, other):
        assert not set(self._values).intersection(other), "Can't merge dictionaries, they have some keys in common"
        other.update(self._values)
        return other

    def toDict(self):
        return self.update({})

    def __call__(self, option):
        return getattr(self, option)

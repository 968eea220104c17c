"""The method registry: records by name and by config class, build code loaded on first use, one default, and
discovery of a package of method subpackages."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
from torch import nn

from hf_tensorcompress import CompressionConfig
from hf_tensorcompress.core.registry import Method, MethodRecord, Registry, method_for, record


@dataclass
class ToyConfig(CompressionConfig):
    """A toy method's options."""

    method: str = "toy"
    method_name: ClassVar[str] = "toy"


class ToyLayer(nn.Module):
    pass


TOY = Method("toy", ToyConfig, lambda model: [], lambda *args: None, accepts=(nn.Linear,), layers=(ToyLayer,))
HERE = __name__


def toy_record(**changes) -> MethodRecord:
    fields = dict(config=f"{HERE}:ToyConfig", build=f"{HERE}:TOY", description="a toy") | changes
    return MethodRecord("toy", **fields)


def test_a_record_resolves_to_its_method_by_name_and_by_config_type():
    registry = Registry()
    registry.register(toy_record())
    assert registry.config_class("toy") is ToyConfig
    assert registry.method_for(ToyConfig()) is TOY is registry.method("toy")


def test_a_second_method_of_the_same_name_or_config_is_refused():
    registry = Registry()
    registry.register(toy_record())
    registry.register(toy_record())  # the very same record again: nothing changes
    with pytest.raises(ValueError, match="already registered"):
        registry.register(toy_record(description="another toy"))
    with pytest.raises(ValueError, match="already configures method 'toy'"):
        registry.register(MethodRecord("other", f"{HERE}:ToyConfig", f"{HERE}:TOY", "x"))


def test_one_method_is_the_default():
    registry = Registry()
    registry.register(toy_record(default=True))
    assert registry.default_name() == "toy"
    with pytest.raises(ValueError, match="cannot be the default"):
        registry.register(MethodRecord("b", f"{HERE}:CompressionConfig", "", "b", default=True))


def test_a_record_whose_method_configures_another_class_is_refused_on_first_use():
    registry = Registry()
    registry.register(toy_record(config=f"{HERE}:CompressionConfig"))
    with pytest.raises(ValueError, match="config class is not"):
        registry.method("toy")


def test_an_unknown_name_or_config_lists_what_there_is():
    with pytest.raises(ValueError, match=r"choose one of \[.*'cp'.*\]"):
        record("nope")
    with pytest.raises(ValueError, match="config of no registered method"):
        method_for(ToyConfig())


def test_a_method_package_is_discovered_at_the_first_lookup(tmp_path, monkeypatch):
    package = tmp_path / "toy_methods"
    (package / "toy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy" / "__init__.py").write_text(
        "from hf_tensorcompress.core.registry import MethodRecord\n"
        "from tests_registry_target import REGISTRY\n"
        f"REGISTRY.register(MethodRecord('toy', '{HERE}:ToyConfig', '{HERE}:TOY', 'a toy'))\n"
    )
    registry = Registry()
    target = type(sys)("tests_registry_target")
    target.REGISTRY = registry
    monkeypatch.setitem(sys.modules, "tests_registry_target", target)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.add_method_package("toy_methods")
    assert "toy_methods.toy" not in sys.modules
    assert list(registry.records()) == ["toy"]
    assert registry.method("toy") is TOY

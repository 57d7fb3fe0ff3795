"""popdist.poptorch, popdist.tensorflow and popdist.popart: lazy imports, clear ImportErrors, fake frameworks."""

import sys
import types

import pytest

import popdist.popart
import popdist.poptorch
import popdist.tensorflow
from popdist import env


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Start outside any launch, with no framework importable and no Options class built yet."""
    for name in (env.NUM_TOTAL_REPLICAS, env.NUM_LOCAL_REPLICAS, env.REPLICA_INDEX_OFFSET, env.INSTANCE_INDEX,
                 env.NUM_INSTANCES, env.NUM_IPUS_PER_REPLICA, env.OMPI_RANK, env.OMPI_SIZE,
                 env.VIPU_API_PARTITION_ID, env.EXECUTABLE_CACHE_PATH):
        monkeypatch.delenv(name, raising=False)
    for name in ("poptorch", "popart", "tensorflow", "tensorflow.python", "tensorflow.python.ipu",
                 "tensorflow.python.ipu.utils"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(popdist.poptorch._Cache, "options", None)


def launch(monkeypatch, **extra: str) -> None:
    """Make this process instance 2 of 4, with 2 of the 8 replicas, 2 IPUs each."""
    for name, value in {env.NUM_TOTAL_REPLICAS: "8", env.NUM_LOCAL_REPLICAS: "2", env.REPLICA_INDEX_OFFSET: "4",
                        env.INSTANCE_INDEX: "2", env.NUM_INSTANCES: "4", env.NUM_IPUS_PER_REPLICA: "2",
                        **extra}.items():
        monkeypatch.setenv(name, value)


def test_importing_the_framework_modules_imports_no_framework():
    """``import popdist.poptorch`` (and tensorflow, popart) works without the framework, which stays unimported."""
    assert all(sys.modules[name] is None for name in ("poptorch", "popart", "tensorflow"))


@pytest.mark.parametrize(("use", "message"), [
    (lambda: popdist.poptorch.Options, "popdist.poptorch needs PopTorch (the 'poptorch' package from the Poplar SDK)"),
    (lambda: popdist.tensorflow.set_ipu_config(object()),
     "popdist.tensorflow needs TensorFlow for the IPU (Graphcore's 'tensorflow' wheel from the Poplar SDK)"),
    (lambda: popdist.popart.getDevice(1), "popdist.popart needs PopART (the 'popart' package from the Poplar SDK)"),
    (lambda: popdist.popart.configureSessionOptions(object()), "popdist.popart needs PopART"),
])
def test_using_a_missing_framework_names_the_package(use, message):
    """The first use that needs the framework raises an ImportError that names it and says it is not installed."""
    with pytest.raises(ImportError) as caught:
        use()

    assert str(caught.value).startswith(message)
    assert str(caught.value).endswith("; it is not installed")


def test_from_import_of_options_is_an_import_error():
    """``from popdist.poptorch import Options`` fails at the import statement, with the same message."""
    with pytest.raises(ImportError, match="needs PopTorch"):
        from popdist.poptorch import Options  # noqa: F401


def test_a_broken_framework_is_not_called_missing(monkeypatch, tmp_path):
    """When the framework is there but fails to import, the error says so and keeps the reason."""
    package = tmp_path / "poptorch"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('libpoplar.so: cannot open shared object', name='poplar')\n")
    monkeypatch.delitem(sys.modules, "poptorch")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ImportError, match=r"importing 'poptorch' failed: libpoplar\.so: cannot open shared object"):
        _ = popdist.poptorch.Options


def ipu_config() -> types.SimpleNamespace:
    """Return an object shaped like TensorFlow's IPUConfig."""
    distribution = types.SimpleNamespace(process_count=1, process_index=0)
    return types.SimpleNamespace(experimental=types.SimpleNamespace(multi_replica_distribution=distribution),
                                 select_ipus=None)


def test_set_ipu_config_sets_the_process_and_the_device(monkeypatch):
    """For an IPUConfig: process count and index, and the device unless configure_device is False."""
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    launch(monkeypatch)
    config, untouched = popdist.tensorflow.set_ipu_config(ipu_config(), 2), ipu_config()
    popdist.tensorflow.set_ipu_config(untouched, 2, configure_device=False)

    distribution = config.experimental.multi_replica_distribution
    assert (4, 2, 26, None) == (distribution.process_count, distribution.process_index, config.select_ipus,
                                untouched.select_ipus)


def test_set_ipu_config_on_the_old_protobuf_uses_the_ipu_utils(monkeypatch):
    """For the deprecated IpuOptions protobuf, the TensorFlow IPU helpers set the same things."""
    utils = types.ModuleType("tensorflow.python.ipu.utils")
    utils.set_experimental_multi_replica_distribution_options = lambda c, **kw: [*c, kw]  # type: ignore[attr-defined]
    utils.select_ipus = lambda c, ids: [*c, ids]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    monkeypatch.setitem(sys.modules, "tensorflow.python.ipu.utils", utils)
    launch(monkeypatch)

    assert [{"process_count": 4, "process_index": 2}, [26]] == popdist.tensorflow.set_ipu_config([], 2)


def test_set_ipu_config_without_the_ipu_build_says_so(monkeypatch):
    """Upstream TensorFlow has no tensorflow.python.ipu: the error says which module is missing."""
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    for name in ("tensorflow.python", "tensorflow.python.ipu", "tensorflow.python.ipu.utils"):
        monkeypatch.delitem(sys.modules, name)

    with pytest.raises(ImportError, match=r"'tensorflow.python' is not installed \(not the IPU build\?\)"):
        popdist.tensorflow.set_ipu_config([])


@pytest.fixture
def fake_popart(monkeypatch):
    """Install a fake ``popart`` whose device manager hands out device ids it knows; return the acquired ids."""
    acquired: list[int] = []

    class DeviceManager:
        def acquireDeviceById(self, device_id: int) -> object:  # noqa: N802 - PopART's name
            acquired.append(device_id)
            return f"device {device_id}" if device_id < 100 else None

    module = types.ModuleType("popart")
    module.DeviceManager = DeviceManager  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "popart", module)
    return acquired


def test_popart_session_options_take_the_launch(monkeypatch, fake_popart):
    """configureSessionOptions sets global and local replication, the replica offset and the cache."""
    launch(monkeypatch, **{env.EXECUTABLE_CACHE_PATH: "/tmp/cache"})
    opts = types.SimpleNamespace()
    popdist.popart.configureSessionOptions(opts)

    assert {"enableDistributedReplicatedGraphs": True, "globalReplicationFactor": 8, "globalReplicaOffset": 4,
            "enableReplicatedGraphs": True, "replicatedGraphCount": 2, "enableEngineCaching": True,
            "cachePath": "/tmp/cache"} == vars(opts)


def test_popart_get_device_acquires_this_instances_device(monkeypatch, fake_popart):
    """getDevice acquires getDeviceId(ipusPerReplica), and says so when it cannot."""
    launch(monkeypatch)

    assert "device 26" == popdist.popart.getDevice(2)
    monkeypatch.setenv(env.NUM_TOTAL_REPLICAS, "512")
    with pytest.raises(RuntimeError, match=r"could not acquire IPU device \d+ \(IPUs per replica: 2"):
        popdist.popart.getDevice(2)

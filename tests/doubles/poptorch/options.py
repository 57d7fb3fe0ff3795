# ruff: noqa: N802, FBT003 - PopTorch's own method names and calls, kept as programs see them
"""
A test double of the parts of PopTorch's ``python/options.py`` that programs under popdist use.

Follows graphcore/poptorch at the tags sdk/poptorch/2.4.0 to sdk/poptorch/3.4.0: ``Options``,
``_DistributedOptions``, ``_TrainingOptions`` and ``_PopartOptions`` behave identically there in
everything kept here. Written for these tests, not copied. Kept: which names each class accepts
(its constructor's option names and private attributes, so ``OptionsDict`` refuses the rest as
PopTorch does), the methods ``replicationFactor``, ``deviceIterations``, ``useIpuId``,
``randomSeed``, ``enableExecutableCaching``, ``showCompilationProgressBar``, ``clone``, the
``Distributed`` / ``Training`` / ``_Popart`` accessors, ``POPTORCH_CACHE_DIR``, and
``Distributed`` reading ``OMPI_COMM_WORLD_SIZE`` / ``OMPI_COMM_WORLD_RANK`` at construction.
Left out: the other option groups (JIT, precision, tensor locations, execution strategies),
``toDict``'s backend options, ``from_json``, and ``randomSeed``'s ``torch.manual_seed`` call
(the seed is only recorded), since none of them concerns popdist.
"""

import copy
import os

from ._options_impl import OptionsDict


class _PopartOptions:
    """PopART session options: a plain dictionary with a frozen flag (not an ``OptionsDict``)."""

    def __init__(self):
        self._is_frozen = False
        self.options = {}
        self.set("instrumentWithHardwareCycleCounter", False)
        self.set("rearrangeAnchorsOnHost", False)

    def __deepcopy__(self, memory):
        copied = _PopartOptions()
        memory[id(self)] = copied
        for key, value in self.__dict__.items():
            setattr(copied, key, False if key == "_is_frozen" else copy.deepcopy(value, memory))
        return copied

    def checkIsFrozen(self, option=None):
        if hasattr(self, "_is_frozen") and option != "_is_frozen" and self._is_frozen:
            raise AttributeError("Can't modify frozen Options")

    def set(self, key, value):
        self.checkIsFrozen()
        self.options[key] = value
        return self


class _TrainingOptions(OptionsDict):
    """``Options.Training``."""

    def __init__(self, popart_options):
        self._popart_options = popart_options
        super().__init__(gradient_accumulation=1,
                         accumulation_and_replication_reduction_type="ReductionType.Mean",
                         meanAccumulationAndReplicationReductionStrategy="MeanReductionStrategy.Post")

    def gradientAccumulation(self, gradient_accumulation):
        self.set(gradient_accumulation=gradient_accumulation)
        return self


class _DistributedOptions(OptionsDict):
    """``Options.Distributed``: this process's id and the number of processes."""

    def __init__(self):
        self._gcd_mappings = {}
        super().__init__(num_distributed_processes=1, distributed_process_id=0, ipuof_configs={})
        self.setEnvVarNames("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")

    def disable(self):
        self.set(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes, var_process_id):
        return self.configureProcessId(int(os.environ.get(var_process_id, "0")),
                                       int(os.environ.get(var_num_processes, "1")))

    def configureProcessId(self, process_id, num_processes):
        self.set(distributed_process_id=process_id)
        self.set(num_distributed_processes=num_processes)
        return self

    @property
    def processId(self):
        return self.distributed_process_id

    @property
    def numProcesses(self):
        return self.num_distributed_processes


class Options(OptionsDict):
    """``poptorch.Options``: takes no constructor argument."""

    def __init__(self):
        self._popart = _PopartOptions()
        self._training = _TrainingOptions(self._popart)
        self._distributed = _DistributedOptions()
        self.showCompilationProgressBar(True)
        self._module_namescope_enabled = True
        super().__init__(replication_factor=1, input_group_size=1, broadcast_buffers=True, device_iterations=1,
                         log_dir=".", max_repeat_logs=4, auto_round_num_ipus=False, anchored_tensors={},
                         output_return_period=1, available_memory_proportion={})
        path = os.environ.get("POPTORCH_CACHE_DIR", "")
        if path:
            self.enableExecutableCaching(path)

    @property
    def Distributed(self):
        return self._distributed

    @property
    def Training(self):
        return self._training

    @property
    def _Popart(self):
        return self._popart

    def showCompilationProgressBar(self, show=True):
        self._show_compilation_progress_bar = show
        return self

    def deviceIterations(self, device_iterations):
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor):
        self.set(replication_factor=replication_factor)
        return self

    def enableExecutableCaching(self, path):
        if path is None:
            self._Popart.set("enableEngineCaching", False)
        else:
            self._Popart.set("cachePath", path)
            self._Popart.set("enableEngineCaching", True)
        return self

    def useIpuId(self, ipu_id):
        assert isinstance(ipu_id, int)
        self.createOrSet(ipu_id=ipu_id)
        return self

    def randomSeed(self, random_seed):
        assert isinstance(random_seed, int)
        self.createOrSet(random_seed=random_seed)
        return self

    def clone(self):
        return copy.deepcopy(self)

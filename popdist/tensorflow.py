"""
PopDist for TensorFlow on the IPU: :func:`set_ipu_config`.

Standalone: TensorFlow (imported on first use, not by ``import popdist.tensorflow``) and the
standard library; never imports ``poprun``. Without TensorFlow, calling :func:`set_ipu_config`
raises an ImportError naming the missing package.
"""

from __future__ import annotations

import os

from popdist import _contract as env
from popdist import _device, _framework

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def set_ipu_config(config: Any, ipus_per_replica: int | None = None, configure_device: bool = True) -> Any:
    """
    Set the PopDist configuration options for TensorFlow: this instance's process index and count.

    Args:
        config: an ``IPUConfig`` (``tensorflow.python.ipu.config.IPUConfig()``), or the deprecated
            ``IpuOptions`` protobuf (``tensorflow.python.ipu.utils.create_ipu_config()``).
        ipus_per_replica: IPUs per replica; ``None`` reads ``POPDIST_NUM_IPUS_PER_REPLICA``.
        configure_device: also select this instance's device, ``getDeviceId(ipus_per_replica)``.

    Returns:
        The config (the same ``IPUConfig``; the protobuf as the TensorFlow helpers return it).

    Raises:
        ImportError: when TensorFlow (for the protobuf: its IPU build) is not installed.
    """
    _framework.require_tensorflow()
    count, index = env.num_instances(os.environ), env.instance_index(os.environ)
    device = _device.device_id(ipus_per_replica)
    if hasattr(config, "experimental"):
        distribution = config.experimental.multi_replica_distribution
        distribution.process_count = count
        distribution.process_index = index
        if configure_device:
            config.select_ipus = device
        return config
    utils = _framework.require_tensorflow("tensorflow.python.ipu.utils")
    config = utils.set_experimental_multi_replica_distribution_options(config, process_count=count,
                                                                       process_index=index)
    return utils.select_ipus(config, [device]) if configure_device else config

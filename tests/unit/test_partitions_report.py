"""Every partition diagnostic (PR500-PR510), rendered: the exact text users see."""

import pytest

from poprun.core.diagnostic import CODES
from poprun.partitions import report as r
from poprun.partitions.provider import PartitionInfo, PartitionState
from poprun.render.diagnostics import render_diagnostic

PART1 = PartitionInfo(name="part1", size=16, num_gcds=1, num_ilds=1, state=PartitionState.PS_ACTIVE)
PART3 = PartitionInfo(name="part3", size=32, num_gcds=2, num_ilds=2, state=PartitionState.PS_ACTIVE)

CASES = {
    "PR500": (lambda: r.not_found("my_partition", [PART1, PART3], "10.3.7.150:8090"),
              ("error[PR500]: partition 'my_partition' not found\n"
               "  --> partition my_partition\n"
               "   = the V-IPU server at 10.3.7.150:8090 has no partition 'my_partition'; it has part1 (16 IPUs, 1 GCD, PS_ACTIVE), part3 (32 IPUs, 2 GCDs, PS_ACTIVE)\n"
               "   = hint: name an existing partition with --vipu-partition, or let poprun create 'my_partition' with --update-partition=yes (list them with 'vipu list partitions'; seed 2.10.1)\n")),
    "PR501": (lambda: r.unreachable("127.0.0.1:9", 120, "Connection refused"),
              ("error[PR501]: V-IPU server unreachable\n"
               "  --> V-IPU server 127.0.0.1:9\n"
               "   = cannot reach the V-IPU server at 127.0.0.1:9 (timeout 120 s): Connection refused\n"
               "   = hint: check --vipu-server-host and --vipu-server-port (or IPUOF_VIPU_API_HOST and IPUOF_VIPU_API_PORT) and that the server runs ('vipu list partitions'; on its host 'systemctl status vipu-server'); a slow server needs a larger --vipu-server-timeout (seed 2.10.1)\n")),
    "PR502": (lambda: r.unreachable_at_planning("127.0.0.1:9", 0.5, "Connection refused"),
              ("warning[PR502]: V-IPU server unreachable while planning\n"
               "  --> V-IPU server 127.0.0.1:9\n"
               "   = no answer from the V-IPU server at 127.0.0.1:9 within 0.5 s (Connection refused); the partition actions are decided at apply time\n"
               "   = hint: start the server or check its address (--vipu-server-host, --vipu-server-port); apply checks the partition again and stops if the server is still unreachable\n")),
    "PR503": (lambda: r.several([PART1, PART3], "10.3.7.150:8090"),
              ("error[PR503]: several partitions, none named\n"
               "  --> V-IPU server 10.3.7.150:8090\n"
               "   = the V-IPU server at 10.3.7.150:8090 has 2 partitions: part1 (16 IPUs, 1 GCD, PS_ACTIVE), part3 (32 IPUs, 2 GCDs, PS_ACTIVE)\n"
               "   = hint: name the one to use with --vipu-partition (or IPUOF_VIPU_API_PARTITION_ID); without a name poprun uses the only partition of the allocation (seed 2.8.3)\n")),
    "PR504": (lambda: r.mismatch("my_partition", ["16 IPUs, the launch needs 32", "1 GCD, the launch needs 2"]),
              ("error[PR504]: partition 'my_partition' does not match the launch\n"
               "  --> partition my_partition\n"
               "   = 16 IPUs, the launch needs 32; 1 GCD, the launch needs 2\n"
               "   = hint: let poprun remove 'my_partition' and create it again to fit with --update-partition=yes, or change the launch to fit the partition (seed 2.10.1)\n")),
    "PR505": (lambda: r.capacity("my_partition", 128, "10.3.7.150:8090", "not enough free IPUs: 128 requested in 8 ILD(s), 64 of 64 free"),
              ("error[PR505]: not enough IPUs in the allocation\n"
               "  --> partition my_partition\n"
               "   = the V-IPU server at 10.3.7.150:8090 cannot make partition 'my_partition' of 128 IPUs: not enough free IPUs: 128 requested in 8 ILD(s), 64 of 64 free\n"
               "   = hint: remove partitions that are no longer needed ('vipu list partitions', 'vipu remove partition NAME'), or ask for fewer IPUs (seed 2.10.1)\n")),
    "PR506": (lambda: r.in_use("my_partition", "poprun@pod7:4242"),
              ("error[PR506]: partition 'my_partition' is in use\n"
               "  --> partition my_partition\n"
               "   = its devices are leased by another launch (poprun@pod7:4242)\n"
               "   = hint: wait for that launch to end or use another partition: IPUs cannot be shared by different programs (seed 2.10.2); a lease of a launch that died expires by itself\n")),
    "PR507": (lambda: r.not_active("my_partition", "PS_ERROR", "reset", 2),
              ("error[PR507]: partition 'my_partition' is not active\n"
               "  --> partition my_partition\n"
               "   = after reset it is in state PS_ERROR, not PS_ACTIVE (2 attempts)\n"
               "   = hint: reset it with 'vipu reset partition my_partition' or --reset-partition=yes, or allow more attempts with --vipu-partition-attempts; if it stays in error, an agent of the partition may be faulty (seed 2.10.2)\n")),
    "PR508": (lambda: r.not_released("my_partition", "remove the partition poprun created", "Connection refused"),
              ("warning[PR508]: partition 'my_partition' not released at exit\n"
               "  --> partition my_partition\n"
               "   = could not remove the partition poprun created: Connection refused\n"
               "   = hint: its lease expires by itself; if poprun created it, remove it with 'vipu remove partition my_partition' once the server answers\n")),
    "PR509": (lambda: r.request_failed("partition 'my_partition'", "10.3.7.150:8090", "invalid partition: size 24 must be a power of 2"),
              ("error[PR509]: V-IPU request failed\n"
               "  --> V-IPU server 10.3.7.150:8090\n"
               "   = partition 'my_partition' at 10.3.7.150:8090: invalid partition: size 24 must be a power of 2\n"
               "   = hint: compare the request with 'vipu list partitions' and the V-IPU server's log; the partition flags (--num-ilds, --sync-type, routing types) must be ones the server accepts\n")),
    "PR510": (lambda: r.malformed("10.3.7.150:8090", "GET /v1/partitions: $.partitions[0].size: expected an integer "
                                                     "from 0 to 2147483647, got -16"),
              ("error[PR510]: V-IPU answer not understood\n"
               "  --> V-IPU server 10.3.7.150:8090\n"
               "   = the V-IPU server at 10.3.7.150:8090 answered, but not as a V-IPU server does: GET /v1/partitions: $.partitions[0].size: expected an integer from 0 to 2147483647, got -16\n"
               "   = hint: check that --vipu-server-host and --vipu-server-port (or IPUOF_VIPU_API_HOST and IPUOF_VIPU_API_PORT) name the V-IPU server itself, not a proxy or another service, and that the 'vipu' on PATH is Graphcore's tool; the server's log may say more\n")),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_partition_diagnostic_text(code):
    """The diagnostic renders exactly as documented in docs/errors/PR5xx.md."""
    make, expected = CASES[code]
    diag = make()

    assert (code, expected) == (diag.code, render_diagnostic(diag))


def test_every_partition_code_has_a_text_case():
    """Each registered PR5xx code is covered here."""
    assert sorted(c for c in CODES if c.startswith("PR5")) == sorted(CASES)

"""
Laws of the metrics file's text: whatever the run id, host names and numbers, both of prometheus_client's parsers read it back.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus

from poprun.apply.metrics import STATES, render
from poprun.core.progress import InstanceProgress

numbers = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def instances(draw: st.DrawFn) -> list[InstanceProgress]:
    indices = draw(st.lists(st.integers(0, 10_000), unique=True, max_size=5))
    return [InstanceProgress(index=i, host=draw(texts), attempt=0, step=draw(numbers),
                             total=draw(st.none() | st.integers(0, 2**63)),
                             steps_per_s=None, step_time_s=draw(numbers), eta_s=draw(numbers),
                             heard_s=draw(st.floats(0, 1e9)), calls=1, straggler_ratio=draw(numbers))
            for i in indices]


@given(run_id=texts, backend=texts, state=st.sampled_from(STATES), counts=st.tuples(st.integers(0, 10**6),
                                                                                    st.integers(0, 10**6)),
       progress=instances())
def test_both_parsers_read_every_text_back(run_id, backend, state, counts, progress):
    """Every label value comes back as it was, every finite number as written, nothing else is made up."""
    text = render(run_id=run_id, backend=backend, state=state, attempt=counts[0], restarts=counts[1], progress=progress)

    read = [s for f in openmetrics(text) for s in f.samples]
    assert len(read) == len([s for f in prometheus(text) for s in f.samples])
    by_index = {p.index: p for p in progress}
    for sample in read:
        assert sample.labels["run_id"] == run_id
        if "instance" in sample.labels:
            instance = by_index[int(sample.labels["instance"])]
            assert sample.labels["host"] == instance.host
            if sample.name == "poprun_instance_step":
                assert math.isclose(sample.value, float(instance.step), rel_tol=1e-15)

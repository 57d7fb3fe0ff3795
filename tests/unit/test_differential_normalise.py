"""
The differential harness's normaliser (tests/differential/differential.py) on fixed inputs.

It replaces only what differs from one run to the next (run ids, times, durations, pids, chosen
ports, hashes of them, temporary paths, the checkout, a differing version), and reorders only
what concurrent writers make unordered; everything else must reach the comparison untouched.
"""

from tests.differential.differential import (
    SORTED,
    canonical_events,
    corpus_argv,
    failure_order,
    log_order,
    normalise,
    unordered,
    verified_line,
)


def test_run_ids_are_numbered_in_the_order_they_first_appear():
    text = "run 20261128-042240-18b676 then 20261128-042241-aaaaaa, again 20261128-042240-18b676\n"

    assert "run <run1> then <run2>, again <run1>\n" == normalise(text)


def test_times_dates_and_seconds_since_1970_are_replaced():
    text = ('04:22:40.953 16719 POPRUN [I] Run x\nstarted 2026-11-28 04:22:40, ran 0.0 s\n'
            '{"v":1,"event":"teardown","time":1795839760.9893}\n"started": 1795839760.953019,\n')

    assert ('<clock> <pid> POPRUN [I] Run x\nstarted <date>, ran <d> s\n'
            '{"v":1,"event":"teardown","time":<epoch>}\n"started": <epoch>,\n') == normalise(text)


def test_durations_pids_ports_and_hashes_are_replaced():
    text = ('Instance 0 (PID 16739) terminated\n{"pid":16740,"ms":12,"after_ms":1001}\n'
            '"phases": {"plan": 0.068167, "run": 0.002269, "teardown": 7e-05}\nMASTER_PORT=28015 MASTER_PORT 30553\n'
            '["MASTER_PORT","28015"] "MASTER_PORT": "62379" "master_port":28015\n'
            '/tmp/poprun-cache-3720e0785533 "env_blake2b": "bf65ab"\n')

    assert ('Instance 0 (PID <pid>) terminated\n{"pid":<pid>,"ms":<d>,"after_ms":<d>}\n'
            '"phases": {"plan": <d>, "run": <d>, "teardown": <d>}\nMASTER_PORT=<port> MASTER_PORT <port>\n'
            '["MASTER_PORT","<port>"] "MASTER_PORT": "<port>" "master_port":<port>\n'
            '/tmp/poprun-cache-<hash> "env_blake2b": "<hash>"\n') == normalise(text)


def test_paths_are_replaced_longest_first_and_versions_only_when_asked():
    paths = {"/tmp/poprun-diff-x/old": "<tmp>", "/tmp/poprun-diff-x/old/venv": "<venv>", "/work/co": "<checkout>"}
    text = "/tmp/poprun-diff-x/old/venv/bin/python /tmp/poprun-diff-x/old/case/work /work/co/poprun 0.1.0\n"

    assert "<venv>/bin/python <tmp>/case/work <checkout>/poprun 0.1.0\n" == normalise(text, paths)
    assert "poprun <version>\n" == normalise("poprun 0.2.0\n", versions=("0.2.0", "<version>"))


def test_what_is_the_same_every_run_is_left_alone():
    text = ('error[PR300]: replicas do not divide\n  --> command line: --num-instances\n'
            '"num_replicas": 2, "timeout": 1.5, exit 124 after 2 s, restart 1 of 1 in 0 s\n'
            '"timeout_ms": 5000, "backoff_ms": 1000, "delay_ms": 0, "ms": "x"\n'
            'Instance 0 terminated with exit code 3\n')

    assert text == normalise(text)


def test_only_adjacent_events_of_concurrent_writers_are_sorted():
    text = ('{"v":1,"event":"run-started","time":<epoch>}\n'
            '{"v":1,"event":"instance-started","time":<epoch>,"index":1}\n'
            '{"v":1,"event":"launch-running","time":<epoch>}\n'
            '{"v":1,"event":"instance-started","time":<epoch>,"index":0}\n'
            '{"v":1,"event":"phase-ended","time":<epoch>,"phase":"start"}\n'
            '{"v":1,"event":"phase-ended","time":<epoch>,"phase":"first-output"}\n'
            '{"v":1,"event":"instance-ended","time":<epoch>,"index":0}\n'
            '{"v":1,"event":"run-ended","time":<epoch>}\n')

    assert ('{"v":1,"event":"run-started","time":<epoch>}\n'
            '{"v":1,"event":"instance-started","time":<epoch>,"index":0}\n'
            '{"v":1,"event":"instance-started","time":<epoch>,"index":1}\n'
            '{"v":1,"event":"launch-running","time":<epoch>}\n'
            '{"v":1,"event":"phase-ended","time":<epoch>,"phase":"start"}\n'
            '{"v":1,"event":"instance-ended","time":<epoch>,"index":0}\n'
            '{"v":1,"event":"phase-ended","time":<epoch>,"phase":"first-output"}\n'
            '{"v":1,"event":"run-ended","time":<epoch>}\n') == canonical_events(text)


def test_what_was_read_back_of_the_instances_is_reduced_to_their_number():
    text = ("phases: plan <d> s\nverified: 0 of 2 instances as planned (argv, environment, CPUs); "
            "1 not read back (on other hosts, or ended before they could be)\n"
            "  instance 1 on localhost: argv not as planned\nnext\n")

    assert ("phases: plan <d> s\nverified: <n> of 2 instances as planned (argv, environment, CPUs) "
            "(what was read back: not compared)\nnext\n") == verified_line(text)


def test_the_order_of_log_reads_is_reduced_to_the_bytes_of_each_stream():
    assert "0 stderr 4 (in all)\n0 stdout 23 (in all)\n1 stdout 5 (in all)\n" == log_order(
        "0 stdout 18\n1 stdout 5\n0 stderr 4\n0 stdout 5\n")


def test_only_the_outputs_of_steps_marked_sorted_are_sorted():
    text = (f"$ poprun a  {SORTED}\n--- stdout\nb\na\n--- exit 0\n$ poprun b\n--- stdout\nd\nc\n--- exit 0\n"
            "=== file x\nz\ny\n")

    assert (f"$ poprun a  {SORTED}\n--- stdout\na\nb\n--- exit 0\n$ poprun b\n--- stdout\nd\nc\n--- exit 0\n"
            "=== file x\nz\ny\n") == unordered(text)


def test_a_corpus_line_becomes_poprun_s_words_up_to_a_pipe():
    command = "poprun --host $HOSTS --num-instances=2 python3 train.py --lr 0.1 | tee log.txt"

    assert ["--host", "pod1,pod2", "--num-instances=2", "python3", "train.py", "--lr", "0.1"] == corpus_argv(command)
    assert corpus_argv('poprun --mpi-global-args="--tag-output python3 x.py') is None


def test_the_padding_after_a_duration_in_a_table_is_made_even():
    text = "RUN  DURATION  INSTANCES\nx    0.1 s     1\ny    10.25 s   2\n"

    assert "RUN  DURATION  INSTANCES\nx    <d> s  1\ny    <d> s  2\n" == normalise(text)


def test_the_failures_of_a_report_are_sorted_and_nothing_else():
    text = ('{\n  "error": null,\n  "failures": [\n    {\n      "index": 1,\n      "tail": [\n        "b"\n      ]\n'
            '    },\n    {\n      "index": 0,\n      "tail": []\n    }\n  ],\n  "statuses": [\n    143,\n    0\n  ]\n}\n')

    assert ('{\n  "error": null,\n  "failures": [\n    {\n      "index": 0,\n      "tail": []\n    },\n    {\n'
            '      "index": 1,\n      "tail": [\n        "b"\n      ]\n    }\n  ],\n  "statuses": [\n    143,\n    0\n  ]\n}\n'
            ) == failure_order(text)
    assert '{"failures": []}\n  "failures": [],\n' == failure_order('{"failures": []}\n  "failures": [],\n')

"""The ssh backend's host-side scripts (poprun.backends.ssh.remote): given an instance, the exact shell text."""

from __future__ import annotations

import shlex

from poprun.backends.ssh import remote
from poprun.backends.ssh.remote import environment_input, remote_command, stdin_command
from poprun.planner.plan import Environment, Instance, Placement

WRAPPER = """\
__poprun_k=$3
__poprun_made() {
  [ "$__poprun_k" != - ] && [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && [ -O "$__poprun_k" ] &&
    [ "$(cat -- "$__poprun_k/.poprun-made" 2>/dev/null)" = TOKEN ]
}
__poprun_done() {
  __poprun_made || return 0
  (command exec 9<"$__poprun_k/.poprun-lock" && flock -n -x 9 && rm -rf -- "$__poprun_k") 2>/dev/null
  return 0
}
IFS= read -r __poprun_go; [ "$__poprun_go" = G ] || { __poprun_done; exit 0; }
__poprun_t=$1; __poprun_f=$2; __poprun_p=$4; shift 4
command -v -- "$__poprun_p" >/dev/null 2>&1 || { [ -x "./$__poprun_p" ] && __poprun_p=./$__poprun_p; }
__poprun_made && command exec 9<"$__poprun_k/.poprun-lock" && flock -s 9
exec 3<&0
if [ "$__poprun_f" = - ]; then setsid -- "$__poprun_p" "$@" </dev/null 3<&- 9<&- &
else mkdir -m 700 -- "$__poprun_f" || exit 125
  mkfifo -m 600 -- "$__poprun_f/in" || { rm -rf -- "$__poprun_f"; exit 125; }
  setsid -- "$__poprun_p" "$@" <"$__poprun_f/in" 3<&- 9<&- &
fi
__poprun_c=$!
{ __poprun_z=
  while :; do
    if [ -n "$__poprun_z" ]; then IFS= read -r __poprun_w || break; __poprun_w=x$__poprun_w
    else __poprun_w=$(timeout "$__poprun_t" sh -c 'IFS= read -r w && echo "x$w"') || break; fi
    case $__poprun_w in
      xT) kill -TERM -$__poprun_c || kill -TERM $__poprun_c;;
      xS) __poprun_z=1; kill -STOP -$__poprun_c || kill -STOP $__poprun_c;;
      xC) __poprun_z=; kill -CONT -$__poprun_c || kill -CONT $__poprun_c;;
    esac
  done
  kill -KILL -$__poprun_c || kill -KILL $__poprun_c; } <&3 3<&- 9<&- >/dev/null 2>&1 &
__poprun_r=$!
exec 3<&- >/dev/null 2>/dev/null
wait $__poprun_c; __poprun_s=$?
kill -KILL -$__poprun_c 2>/dev/null
kill $__poprun_r 2>/dev/null
[ "$__poprun_f" = - ] || rm -rf -- "$__poprun_f"
exec 9<&-
__poprun_done
exit $__poprun_s""".replace("TOKEN", remote._TOKEN)  # this poprun's own: a cache made on a host holds it

READ_ENV = """\
IFS= read -r __poprun_n || exit 0
__poprun_e=$(head -c "$__poprun_n"; echo .) || exit 0
eval "${__poprun_e%.}"; unset __poprun_e __poprun_n"""

STDIN = """\
__poprun_i=0
until [ -d "$1" ] && [ ! -h "$1" ] && [ -O "$1" ] && [ -p "$1/in" ] && [ ! -h "$1/in" ] && [ -O "$1/in" ]; do
  [ $__poprun_i -lt 200 ] || exit 0; sleep 0.05; __poprun_i=$((__poprun_i + 1)); done
exec 3<&0
cat <&3 > "$1/in" 3<&- &
__poprun_c=$!
exec 3<&- </dev/null
while [ -d "$1" ] && kill -0 $__poprun_c 2>/dev/null; do sleep 1; done
kill $__poprun_c 2>/dev/null
wait $__poprun_c
"""

CHECK = """\
(trap '' PIPE
command -v setsid >/dev/null 2>&1 || echo 'poprun-preflight setsid'
command -v flock >/dev/null 2>&1 || echo 'poprun-preflight flock'
command -v timeout >/dev/null 2>&1 || echo 'poprun-preflight timeout'
command -v -- python3 >/dev/null 2>&1 || [ -x ./python3 ] || echo 'poprun-preflight program 'python3
[ -e train.py ] || echo 'poprun-preflight script 'train.py
echo "poprun-preflight id $(cat /proc/sys/kernel/random/boot_id 2>/dev/null) $(readlink /proc/self/ns/net 2>/dev/null)"
echo 'poprun-preflight ok'
)"""


def planned(**changes: object) -> Instance:
    """Return instance 0 on h1 that runs ``python3 train.py --lr it's`` in ``/work dir``."""
    values: dict[str, object] = {
        "index": 0, "host": "h1", "local_index": 0, "ild": 0, "gcd": 0, "replica_offset": 0, "num_local_replicas": 1,
        "argv": ("python3", "train.py", "--lr", "it's"), "cwd": "/work dir",
        "env": Environment(set=(("A", "1"),), forward=("PATH",), unset=("IPUOF_CONFIG_PATH",)),
        "placement": Placement(numa_aware=False, strategy="none"), "mpi_local_args": ()}
    return Instance(**(values | changes))  # type: ignore[arg-type]


def test_the_wrapper_the_environment_reader_and_the_stdin_copy_are_these_texts() -> None:
    assert (WRAPPER, READ_ENV, STDIN) == (remote._WRAPPER, remote._READ_ENV, remote._STDIN)


def test_remote_command_reads_its_variables_checks_the_host_then_runs_the_wrapper() -> None:
    expected = "\n".join([
        READ_ENV,
        "cd -- '/work dir' || exit 125",
        "unset IPUOF_CONFIG_PATH",
        CHECK,
        f"sh -c {shlex.quote(WRAPPER)} poprun-instance 15 - - python3 train.py --lr 'it'\"'\"'s'",
    ])

    assert expected == remote_command(planned())


def test_remote_command_of_a_restarted_instance_makes_the_cache_and_reads_a_fifo_without_a_check() -> None:
    expected = "\n".join([
        READ_ENV,
        "cd -- '/work dir' || exit 125",
        "unset IPUOF_CONFIG_PATH",
        "if [ -d /tmp/c ]; then __poprun_k=/tmp/c/x; else __poprun_k=/tmp/x; fi",
        "export POPDIST_EXECUTABLE_CACHE_PATH=$__poprun_k",
        ('if mkdir -m 700 -- "$__poprun_k" 2>/dev/null; then : > "$__poprun_k/.poprun-lock" && '
         f'printf %s {remote._TOKEN} > "$__poprun_k/.poprun-made" || echo "poprun-preflight cache $__poprun_k"'),
        ('elif [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && { [ -O "$__poprun_k" ] || '
         '{ __poprun_o=$(ls -ldn -- "$__poprun_k") && set -- $__poprun_o && [ "$3" = 0 ]; }; }; then :'),
        'else echo "poprun-preflight cache $__poprun_k"; fi',
        (f'sh -c {shlex.quote(WRAPPER)} poprun-instance 6 /tmp/poprun-stdin-1 "$__poprun_k" '
         "python3 train.py --lr 'it'\"'\"'s'"),
    ])

    actual = remote_command(planned(), cache="/tmp/c/x", cache_instances=(0, 1), host_timeout_s=6,
                            stdin_directory="/tmp/poprun-stdin-1", check=False)

    assert expected == actual


def test_remote_command_of_a_later_instance_of_the_host_uses_the_cache_without_making_it() -> None:
    lines = remote_command(planned(index=1), cache="/tmp/c/x", cache_instances=(0, 1)).split("\n")

    assert ["if [ -d /tmp/c ]; then __poprun_k=/tmp/c/x; else __poprun_k=/tmp/x; fi",
            "export POPDIST_EXECUTABLE_CACHE_PATH=$__poprun_k", "(trap '' PIPE"] == lines[5:8]


def test_a_bound_instance_checks_for_taskset_and_runs_through_the_binding() -> None:
    text = remote_command(planned(placement=Placement(numa_aware=True, strategy="spread", numa_nodes="1", cpus="4-7")))

    assert "command -v taskset >/dev/null 2>&1 || echo 'poprun-preflight taskset'" in text.split("\n")
    assert text.endswith(" poprun-bind 4-7 1 python3 train.py --lr 'it'\"'\"'s'")


def test_environment_input_is_a_count_then_the_exports_of_the_forwarded_and_set_names_present() -> None:
    expected = b"32\nexport PATH=/bin\nexport 'A=x y'\n"

    assert expected == environment_input(planned(), {"PATH": "/bin", "A": "x y", "B": "not the plan's"})


def test_stdin_command_runs_the_copy_with_its_directory_quoted() -> None:
    assert f"sh -c {shlex.quote(STDIN)} poprun-stdin '/tmp/d x'" == stdin_command("/tmp/d x")

"""The launch-script reader: the bash it evaluates as data, and what it refuses."""

import pytest

from estimator import ConfigError
from estimator.importers.shell import read_launch


def entry(word):
    return word.endswith("train.py")


def launch(text):
    return read_launch(text, entry)


def test_variables_arrays_defaults_and_arithmetic():
    script = """
    GPUS=${GPUS:-4}   # the caller may set it
    NODES=2
    WORLD=$(($GPUS*$NODES))
    ARGS=(
        --a 1      # a comment inside the array
        "--b two words"
    )
    ARGS+=(--c "$WORLD")
    EXTRA="--d x --e"
    torchrun --nproc_per_node $GPUS --nnodes ${NODES} train.py ${ARGS[@]} $EXTRA "${1:-pos default}" 2>&1 | tee log
    """
    got = launch(script)
    assert got.launcher == ("torchrun", "--nproc_per_node", "4", "--nnodes", "2")
    assert got.args == ("--a", "1", "--b", "two", "words", "--c", "8", "--d", "x", "--e", "pos default")


def test_quoted_array_keeps_elements_and_unset_variables_stay_as_written():
    got = launch('A=("x y" z)\npython train.py "${A[@]}" --save $CKPT --load "$1"')
    assert got.args == ("x y", "z", "--save", "$CKPT", "--load", "$1")


def test_if_else_on_variables():
    script = """
    MODE=fp8
    if [[ "$MODE" == "fp8" ]] && [ -z "$UNSET" ]; then
        F=(--fp8)
    elif [[ "$MODE" == "bf16" ]]; then
        F=(--bf16)
    else
        F=(--fp32)
    fi
    if [ ! -f train.py ]; then F+=(--never); fi
    python train.py ${F[@]}
    """
    got = launch(script)
    assert got.args == ("--fp8",)
    assert any("$UNSET is not set" in n for n in got.notes)
    assert any("cannot decide" in n for n in got.notes)


def test_command_substitution_outside_the_launch_is_never_run():
    got = launch('mkdir -p "$(dirname "$X")"\nD=`date`\npython train.py --n 1')
    assert got.args == ("--n", "1")


@pytest.mark.parametrize("text", ["python train.py --n $(rm -rf /tmp/x)", "python train.py --n `id`",
                                  'V=$(cat /etc/passwd)\npython train.py --n "$V"'])
def test_command_substitution_in_the_launch_is_refused(text):
    with pytest.raises(ConfigError, match="nothing is run"):
        launch(text)


def test_launch_inside_a_loop_is_refused():
    with pytest.raises(ConfigError, match="block"):
        launch("for i in 1 2; do\n  python train.py --n $i\ndone")


def test_arguments_file_without_a_launch():
    got = launch('TOKENIZER=org/x\nMODEL_ARGS=" \\\n  --a 1 \\\n  --b"\n--c 3 --d\n')
    assert got.entry == "" and got.args == ("--a", "1", "--b", "--c", "3", "--d")


def test_two_launches_are_refused():
    with pytest.raises(ConfigError, match="twice"):
        launch("python train.py --a\npython train.py --b")

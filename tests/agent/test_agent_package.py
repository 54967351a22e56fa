"""The agent as its own distribution (``agent/pyproject.toml``): its wheel holds the
agent and ``modeldata`` (what agent and coordinator both read of a model) and
nothing else of the repository, installs with the ``llamacpp`` extra into
a fresh virtualenv (no system site-packages), and ``ballast-agent run`` started
outside the repository answers a real request with the real model against a
coordinator started here. ``-m package`` selects it.

pip installs llama-cpp-python from the wheel it cached when ``./dev`` compiled it
(``--find-links`` to that wheel's folder), so the install does not compile
llama.cpp again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from agent import __version__
from ballast.stack import ROOT
from tests.e2e import conftest as e2e

# the end-to-end tests' fixtures: a coordinator started the way the README does
e2e_env, stack, renter_key, machine = (
    e2e.e2e_env,
    e2e.stack,
    e2e.renter_key,
    e2e.machine,
)

MODEL = "smollm2-135m-instruct"

pytestmark = [pytest.mark.e2e, pytest.mark.package, pytest.mark.timeout(900)]


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command, failing the test with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, (
        f"{args[:4]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def cached_llama_wheel_dirs() -> list[str]:
    """Folders of llama-cpp-python wheels in pip's cache (built by ``./dev``)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "list", "--format=abspath"],
        capture_output=True,
        text=True,
        check=False,
    )
    return sorted(
        {
            str(Path(line).parent)
            for line in done.stdout.splitlines()
            if Path(line).name.startswith("llama_cpp_python-")
        }
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The agent's wheel, built from ``agent/``."""
    out = tmp_path_factory.mktemp("dist")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out)]
        + [str(ROOT / "agent")]
    )
    (built,) = out.glob("ballast_agent-*.whl")
    return built


def test_it_builds_a_wheel_of_the_agent_alone(wheel):
    assert wheel.name == f"ballast_agent-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"ballast_agent-{__version__}.dist-info/"
    outside = [
        n for n in names if not n.startswith(("agent/", "modeldata/", dist_info))
    ]
    assert outside == [], "the wheel ships only the agent and modeldata"
    sources = {
        str(path.relative_to(ROOT))
        for package in ("agent", "modeldata")
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert {n for n in names if not n.startswith(dist_info)} == sources
    with zipfile.ZipFile(wheel) as zipped:
        metadata = zipped.read(dist_info + "METADATA").decode()
        entry_points = zipped.read(dist_info + "entry_points.txt").decode()
    assert "ballast-agent = agent.cli:main" in entry_points
    assert "Provides-Extra: llamacpp" in metadata
    assert "Provides-Extra: nvidia" in metadata
    requires = [
        line.split(":", 1)[1].strip().lower()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert any(r.startswith("websockets") for r in requires)
    assert any(r.startswith("llama-cpp-python") and "llamacpp" in r for r in requires)
    assert not any(r.startswith(("django", "celery", "channels")) for r in requires)


def test_it_runs_from_a_fresh_virtualenv_outside_the_repository(
    wheel, tmp_path, stack, renter_key, machine
):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    links = [arg for folder in cached_llama_wheel_dirs() for arg in ("-f", folder)]
    run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *links]
        + [f"{wheel}[llamacpp]"],
        timeout=600,
    )
    outside = tmp_path / "host-home"
    outside.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")
    }
    python = str(venv / "bin" / "python")
    no_coordinator = subprocess.run(
        [python, "-c", "import jobs"], cwd=outside, env=env, capture_output=True
    )
    assert no_coordinator.returncode != 0, "no coordinator code on the agent's path"
    located = run(
        [python, "-c", "import agent, llama_cpp; print(agent.__file__)"],
        cwd=outside,
        env=env,
    )
    assert located.stdout.strip().startswith(str(venv))
    version = run([str(venv / "bin" / "ballast-agent"), "--version"], cwd=outside)
    assert version.stdout.strip() == f"ballast-agent {__version__}"

    stack.spawn(
        "ballast-agent",
        [str(venv / "bin" / "ballast-agent"), "run", "--server", stack.url]
        + ["--key-file", str(outside / "key.pem")],
        env={"BALLAST_MACHINE_TOKEN": machine("pip-rig"), "PYTHONPATH": ""},
        cwd=outside,
    )
    stack.wait_for_capacity(renter_key, MODEL)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        temperature=0,
        max_tokens=48,
    )
    completion = raw.parse()
    assert "4" in completion.choices[0].message.content
    job = httpx.get(
        f"{stack.url}/v1/jobs/{raw.headers['x-ballast-job-id']}",
        headers={"Authorization": f"Bearer {renter_key}"},
    ).json()
    assert job["status"] == "succeeded"
    assert job["attempts"][0]["device"].startswith("pip-rig/")

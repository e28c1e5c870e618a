"""The default pool size: the CPUs the process may run on, within its
cgroup's CPU quota (subwabbit.cpus). The layouts of cgroup v1 and v2 are
built in a temporary folder; one test puts a real process into a real
cgroup with a quota, where this machine allows it."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from subwabbit.cpus import cpu_quota, usable_cpus

from conftest import scoring_args


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def listing(tmp_path, text):
    write(tmp_path / "proc-cgroup", text)
    return str(tmp_path / "proc-cgroup")


def v2_root(tmp_path):
    root = tmp_path / "cg"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    return root


def test_v2_quota_of_the_process_cgroup(tmp_path):
    root = v2_root(tmp_path)
    write(root / "cpu.max", "max 100000\n")
    write(root / "kubepods" / "pod1" / "cpu.max", "150000 100000\n")
    proc = listing(tmp_path, "0::/kubepods/pod1\n")
    assert cpu_quota(str(root), proc) == 1.5


def test_v2_the_smallest_quota_on_the_way_up_applies(tmp_path):
    root = v2_root(tmp_path)
    write(root / "a" / "cpu.max", "100000 100000\n")
    write(root / "a" / "b" / "cpu.max", "max 100000\n")
    write(root / "a" / "b" / "c" / "cpu.max", "400000 100000\n")
    assert cpu_quota(str(root), listing(tmp_path, "0::/a/b/c\n")) == 1.0


def test_v2_in_a_container_the_host_path_is_not_mounted(tmp_path):
    # The container sees its own cgroup as the mount's root.
    root = v2_root(tmp_path)
    write(root / "cpu.max", "200000 100000\n")
    assert cpu_quota(str(root), listing(tmp_path, "0::/docker/0123abcd\n")) == 2.0


def test_v2_beside_v1_on_a_hybrid_system(tmp_path):
    # cgroup v1 mounted at the root (a tmpfs), v2 at unified/
    root = tmp_path / "cg"
    write(root / "unified" / "cgroup.controllers", "\n")
    write(root / "unified" / "svc" / "cpu.max", "300000 100000\n")
    assert cpu_quota(str(root), listing(tmp_path, "1:cpu:/\n0::/svc\n")) == 3.0


def test_odd_bytes_in_the_files_give_no_quota_and_no_error(tmp_path):
    root = v2_root(tmp_path)
    (root / "caf\xe9").mkdir()
    (root / "cpu.max").write_bytes(b"\xff\xfe 100000\n")
    (tmp_path / "proc-cgroup").write_bytes(b"0::/caf\xe9\n")
    assert cpu_quota(str(root), str(tmp_path / "proc-cgroup")) is None
    assert usable_cpus(str(root), str(tmp_path / "proc-cgroup")) >= 1


def test_v1_quota_of_the_cpu_hierarchy(tmp_path):
    root = tmp_path / "cg"
    write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us", "250000\n")
    write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_period_us", "100000\n")
    # another hierarchy's quota-like file is not read
    write(root / "memory" / "docker" / "x" / "cpu.cfs_quota_us", "1000\n")
    proc = listing(tmp_path, "5:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/\n")
    assert cpu_quota(str(root), proc) == 2.5


@pytest.mark.parametrize("files", [
    {},                                                    # no cgroup file system
    {"cpu.max": "max 100000\n"},                           # v2, no limit
    {"cpu.max": "garbage\n"},                              # unreadable: no limit
    {"cpu.max": "0 100000\n"},
])
def test_no_quota(tmp_path, files):
    root = v2_root(tmp_path)
    for name, text in files.items():
        write(root / name, text)
    assert cpu_quota(str(root), listing(tmp_path, "0::/\n")) is None


def test_no_proc_listing(tmp_path):
    assert cpu_quota(str(tmp_path), str(tmp_path / "missing")) is None


def test_usable_cpus_is_the_affinity_within_the_quota_rounded_up(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    root = v2_root(tmp_path)
    write(root / "cpu.max", "50000 100000\n")  # half a CPU: still one engine
    proc = listing(tmp_path, "0::/\n")
    assert usable_cpus(str(root), proc) == 1
    write(root / "cpu.max", f"{affinity * 100000 + 1} 100000\n")  # more than the CPUs
    assert usable_cpus(str(root), proc) == affinity
    write(root / "cpu.max", "max 100000\n")
    assert usable_cpus(str(root), proc) == affinity


def _writable_cpu_cgroup():
    """A new cgroup with a CPU quota file this test may write, and that
    file's name; ``None`` where none can be made (not root, no controller)."""
    candidates = [("/sys/fs/cgroup/cpu", "cpu.cfs_quota_us")]  # v1
    try:
        with open("/sys/fs/cgroup/cgroup.subtree_control", encoding="ascii") as control:
            if "cpu" in control.read().split():
                candidates.append(("/sys/fs/cgroup", "cpu.max"))  # v2
    except OSError:
        pass
    for parent, quota_file in candidates:
        path = os.path.join(parent, f"subwabbit-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        if os.path.isfile(os.path.join(path, quota_file)):
            return path, quota_file
        os.rmdir(path)
    return None


def test_a_pool_in_a_cgroup_with_a_quota_of_one_cpu_starts_one_engine(trained_model):
    if usable_cpus() < 2:
        pytest.skip("needs 2 CPUs to show the quota lowering the default")
    made = _writable_cpu_cgroup()
    if made is None:
        pytest.skip("no cgroup with a CPU quota can be made here (needs root)")
    path, quota_file = made
    try:
        with open(os.path.join(path, quota_file), "w", encoding="ascii") as quota:
            quota.write("100000" if quota_file == "cpu.cfs_quota_us" else "100000 100000")
        child = (
            "import os, sys\n"
            f"open({os.path.join(path, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
            "from subwabbit import VowpalWabbitPool\n"
            "from conftest import DictFormatter, common, items\n"
            f"with VowpalWabbitPool(DictFormatter(), {scoring_args(trained_model)!r}) as pool:\n"
            "    print(pool.size, len(pool.engine_pids()), len(pool.predict(common(1), items(5))))\n"
        )
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                             timeout=120, check=True,
                             env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
        assert out.stdout.split() == ["1", "1", "5"]
    finally:
        try:
            os.rmdir(path)
        except OSError:  # its process may still be exiting
            time.sleep(0.5)
            os.rmdir(path)

import { spawnSync } from "node:child_process";
import { ownCgroup } from "../../controller/daemon/cgroup.ts";
import { capabilities } from "../../native/index.ts";
import { PYTHON } from "./python.ts";
import { withSbin } from "./slurm.ts";

/** Something a suite needs beyond the README's prerequisites (Node 20, npm, python3, g++, make). */
export interface Prerequisite {
  /** What is needed, as "torch 2.6 or newer for .venv/bin/python". */
  readonly what: string;
  /** Why it is missing here, or null when it is here. */
  readonly missing: string | null;
  /** How to get it. */
  readonly install: string;
  /** Set where its absence is an error, not a skip: the environment that promises it. */
  readonly promisedBy: string | null;
}

// .ci/run installs every package and runs as root.
const ci = process.env.CI ? "CI (.ci/run installs it)" : null;

/** The oldest torch the hook supports (sdk/python/pyproject.toml says the same). */
const MIN_TORCH = [2, 6];

/** torch ≥ 2.6 for the tests' interpreter (test/helpers/python.ts), probed once per test file. */
export function torch(): Prerequisite {
  const probe = spawnSync(PYTHON, ["-c", "import torch; print(torch.__version__)"], { encoding: "utf8" });
  const error = probe.stderr?.trim().split("\n").at(-1) || probe.error?.message;
  const version = probe.status === 0 ? probe.stdout.trim() : null;
  const [major = 0, minor = 0] = (version ?? "").split(".").map(Number);
  const old = version !== null && (major < MIN_TORCH[0]! || (major === MIN_TORCH[0] && minor < MIN_TORCH[1]!));
  return {
    what: `torch ${MIN_TORCH.join(".")} or newer for ${PYTHON}`,
    missing: version === null ? `${PYTHON} cannot import torch (${error})` : old ? `${PYTHON} has torch ${version}` : null,
    install: "npm run setup:python (torch 2.13.0 for CPU in .venv), or set MONKEYTREE_PYTHON to an interpreter with torch",
    promisedBy: ci,
  };
}

/** Python packages for the tests' interpreter, from sdk/python/requirements-dev.txt. */
export function pythonPackages(packages: readonly string[]): Prerequisite {
  const script = `import importlib.util as u; print(" ".join(m for m in ${JSON.stringify(packages)} if u.find_spec(m) is None))`;
  const probe = spawnSync(PYTHON, ["-c", script], { encoding: "utf8" });
  const absent = probe.status === 0 ? probe.stdout.trim() : `(${probe.stderr?.trim().split("\n").at(-1) || probe.error?.message})`;
  return {
    what: `${packages.join(", ")} for ${PYTHON}`,
    missing: absent ? `${PYTHON} lacks ${absent}` : null,
    install: "npm run setup:python (installs sdk/python/requirements-dev.txt into .venv)",
    promisedBy: ci,
  };
}

/** The hook's lint and test tools. */
export const pythonTools = (): Prerequisite => pythonPackages(["ruff", "mypy", "pytest"]);

/** Debian's python3 makes virtual environments with pip only with python3-venv (ensurepip). */
export function venv(): Prerequisite {
  const probe = spawnSync(PYTHON, ["-c", "import ensurepip"], { encoding: "utf8" });
  return {
    what: `virtual environments with pip for ${PYTHON}`,
    missing: probe.status === 0 ? null : `${PYTHON} has no ensurepip, so \`python3 -m venv\` cannot install pip`,
    install: "apt-get install python3-venv",
    promisedBy: ci,
  };
}

/** Root with iproute2, to emulate hosts as network namespaces. */
export function networkNamespaces(): Prerequisite {
  const install = "run as root, with apt-get install iproute2";
  const what = "network namespaces";
  if (process.getuid?.() !== 0) return { what, missing: "network namespaces need root", install, promisedBy: ci };
  const probe = `mtprobe${process.pid}`;
  const add = spawnSync("ip", ["netns", "add", probe], { encoding: "utf8" });
  if (add.status !== 0) return { what, missing: `ip netns add failed: ${add.stderr?.trim() || add.error?.message}`, install, promisedBy: ci };
  spawnSync("ip", ["netns", "del", probe]);
  return { what, missing: null, install, promisedBy: ci };
}

/**
 * A usable RDMA device for this build. CI's `npm test` host has none: `npm run test:rdma` runs
 * the RDMA suites in a virtual machine with a soft-RoCE device, and sets MONKEYTREE_REQUIRE_RDMA.
 */
export function rdmaDevice(): Prerequisite {
  const { rdma } = capabilities();
  return {
    what: "an RDMA device",
    missing: rdma.available ? null : (rdma.reason ?? "RDMA is unavailable"),
    install:
      "apt-get install libibverbs-dev ibverbs-providers, rebuild with npm install, and run on a host with an RDMA NIC " +
      "or as root with `npm run test:rdma` (a soft-RoCE VM: apt-get install qemu-system-x86 busybox-static kmod cpio)",
    promisedBy: process.env.MONKEYTREE_REQUIRE_RDMA === "1" ? "MONKEYTREE_REQUIRE_RDMA=1" : null,
  };
}

/**
 * Whether `suite` can run here. When something it needs is missing it says so in one line on
 * stderr, with what to install, and the suite skips; where an environment promises that thing
 * (CI, MONKEYTREE_REQUIRE_RDMA) the absence throws instead, failing the file.
 */
export function canRun(suite: string, ...needs: Prerequisite[]): boolean {
  const missing = needs.filter((need) => need.missing !== null);
  if (missing.length === 0) return true;
  const promised = missing.find((need) => need.promisedBy !== null);
  if (promised) throw new Error(`${suite} cannot run: ${promised.missing}, but ${promised.promisedBy} promises ${promised.what}; install: ${promised.install}`);
  process.stderr.write(`skipping ${suite}: ${missing.map((need) => `${need.missing}; install: ${need.install}`).join("; and ")}\n`);
  return false;
}

/** Root, to start processes as another user (a daemon's --run-as). */
export function root(): Prerequisite {
  return {
    what: "root",
    missing: process.getuid?.() === 0 ? null : "starting a process as another user needs root",
    install: "run the tests as root",
    promisedBy: ci,
  };
}

/** A cgroup v2 this process may make children in, for the daemon's cgroup per replacement. */
export function cgroupV2(): Prerequisite {
  return {
    what: "a writable cgroup v2",
    missing: ownCgroup() === null ? "this process's cgroup v2 is not mounted or not writable (/proc/self/cgroup, /proc/self/mountinfo)" : null,
    install: "run the tests as root on a host that mounts cgroup v2",
    promisedBy: ci,
  };
}

/** Slurm and munge from Debian's packages, as root: the slurmd of test/helpers/slurm.ts start jobs as their users. */
export function slurm(): Prerequisite {
  const install = "apt-get install slurm-wlm munge, and run the tests as root";
  const what = "Slurm (slurmctld, slurmd) and munge";
  const commands = ["munged", "mungekey", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scontrol", "scancel"];
  const missing = commands.filter((command) => spawnSync("sh", ["-c", `command -v ${command}`], { env: withSbin() }).status !== 0);
  if (missing.length) return { what, missing: `${missing.join(", ")} not found`, install, promisedBy: ci };
  if (process.getuid?.() !== 0) return { what, missing: "slurmd must run as root", install, promisedBy: ci };
  return { what, missing: null, install, promisedBy: ci };
}

/** Debian's Prometheus server, to scrape the demo's metrics as an operator's would. */
export function prometheus(): Prerequisite {
  const probe = spawnSync("prometheus", ["--version"], { encoding: "utf8" });
  return {
    what: "the prometheus server",
    missing: probe.status === 0 ? null : `prometheus --version failed: ${probe.error?.message ?? probe.stderr?.trim()}`,
    install: "apt-get install prometheus",
    promisedBy: ci,
  };
}

/** A browser to open `simulate --report`'s page in, headless. */
export function chromium(): Prerequisite {
  const probe = spawnSync("chromium", ["--version"], { encoding: "utf8" });
  return {
    what: "the chromium browser",
    missing: probe.status === 0 ? null : `chromium --version failed: ${probe.error?.message ?? probe.stderr?.trim()}`,
    install: "apt-get install chromium",
    promisedBy: ci,
  };
}

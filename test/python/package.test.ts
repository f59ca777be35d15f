import { spawn, spawnSync } from "node:child_process";
import { cpSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, join, relative } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI } from "../../cli/paths.ts";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { CHANNEL_ENV, CRC32C_LIBRARY_ENV } from "../../sdk/contract/protocol/channel.ts";
import { freePort } from "../helpers/net.ts";
import { canRun, torch, venv } from "../helpers/prerequisites.ts";
import { PYTHON } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { startController, tempDir, type Harness } from "../service/harness.ts";

// sdk/python as a user gets it: `pip install` into a fresh virtual environment, then a training
// script run through `monkeytree launch` with nothing on PYTHONPATH.
const root = new URL("../../", import.meta.url).pathname;
const { version } = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string };
const train = join(root, "examples/ddp/train.py");

describe("the Python package's version", () => {
  it("equals package.json's: the hook and the launcher it speaks to are released together", () => {
    const source = readFileSync(join(root, "sdk/python/monkeytree/_version.py"), "utf8");
    expect(source.match(/^__version__ = "([^"]*)"$/m)?.[1]).toBe(version);
  });

  it("is printed by python3 -m monkeytree --version where torch cannot be imported", () => {
    // A None entry in sys.modules makes every `import torch` fail, as on a host without it.
    const script =
      "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['monkeytree', '--version']; runpy.run_module('monkeytree', run_name='__main__')";
    const result = spawnSync("python3", ["-c", script], { env: { ...process.env, PYTHONPATH: join(root, "sdk/python") }, encoding: "utf8" });
    expect({ code: result.status, stdout: result.stdout, stderr: result.stderr }).toEqual({ code: 0, stdout: `monkeytree ${version}\n`, stderr: "" });
  });
});

const canInstall = canRun("test/python/package.test.ts", torch(), venv());

interface Exit {
  code: number | null;
  stdout: string;
  stderr: string;
}

describe.skipIf(!canInstall)(`sdk/python installed with pip into a virtual environment that sees ${PYTHON}'s torch`, () => {
  let dir: string;
  let python: string;
  // Nothing that would find the hook, or the addon's library, without the install and the launcher.
  const env: Record<string, string | undefined> = {
    ...process.env,
    PYTHONPATH: undefined,
    [CRC32C_LIBRARY_ENV]: undefined,
    [CHANNEL_ENV]: undefined,
    OMP_NUM_THREADS: "1",
  };
  const run = (args: string[]): Exit => {
    const result = spawnSync(python, args, { cwd: dir, env, encoding: "utf8" });
    return { code: result.status, stdout: result.stdout, stderr: result.stderr };
  };

  beforeAll(() => {
    dir = tempDir();
    python = join(dir, "venv/bin/python");
    // Built from a copy, so the build's scratch (build/, *.egg-info) stays out of the checkout;
    // the lint and test tools' caches (mypy's holds torch's types) stay behind.
    const source = join(dir, "src");
    const caches = ["__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"];
    cpSync(join(root, "sdk/python"), source, { recursive: true, filter: (path) => !caches.includes(basename(path)) });
    const step = (program: string, ...args: string[]): string => {
      const result = spawnSync(program, args, { cwd: dir, env, encoding: "utf8" });
      if (result.status !== 0) throw new Error(`${program} ${args.join(" ")} failed (${result.status}): ${result.stderr}; .ci/run installs python3-venv`);
      return result.stdout.trim();
    };
    step(PYTHON, "-m", "venv", join(dir, "venv"));
    // An environment that has torch already, as a training environment does: the new one sees
    // the tests' torch (and setuptools, which the offline build needs) through a path file
    // rather than installing another copy of its 700 MB.
    const sitePackages = step(PYTHON, "-c", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))");
    const own = step(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])");
    writeFileSync(join(own, "training-environment.pth"), `${sitePackages}\n`);
    // Python 3.11's venv bundles setuptools 65, which comes first on sys.path and cannot build a
    // wheel without the wheel package (`invalid command 'bdist_wheel'`); the environment's own
    // setuptools (≥ 70.1 builds wheels by itself) is the one to build with.
    step(python, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools");
    step(python, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index", source);
  }, 3 * SAFETY_NET_MS);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("is imported from the environment, and `python -m monkeytree` prints its version and help, or one line and exit 2", () => {
    const where = run(["-c", "import monkeytree; print(monkeytree.__file__)"]);
    expect(relative(join(dir, "venv"), where.stdout.trim())).toMatch(/^lib\/python3\.\d+\/site-packages\/monkeytree\/__init__\.py$/);
    // PEP 561: a training script's type checker reads the installed package's annotations.
    expect(run(["-c", "import importlib.resources as r; print(r.files('monkeytree').joinpath('py.typed').is_file())"])).toEqual({
      code: 0,
      stdout: "True\n",
      stderr: "",
    });
    expect(run(["-m", "monkeytree", "--version"])).toEqual({ code: 0, stdout: `monkeytree ${version}\n`, stderr: "" });
    expect(run(["-m", "monkeytree", "--help"])).toMatchObject({
      code: 0,
      stdout: expect.stringMatching(/^usage: python3 -m monkeytree \(--version \| --help\)\n/),
      stderr: "",
    });
    expect(run(["-m", "monkeytree", "--verbose"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "python3 -m monkeytree: expected --version or --help, got --verbose\n",
    });
    expect(run(["-m", "monkeytree"])).toEqual({ code: 2, stdout: "", stderr: "python3 -m monkeytree: expected --version or --help, got no arguments\n" });
  });

  describe("under `monkeytree launch`", () => {
    let harness: Harness;
    let daemon: HostDaemon;
    beforeAll(async () => {
      // The job's master host needs a daemon: its address is where the job's group meets.
      const daemons = new DaemonHosts(2_000);
      harness = await startController({ overrides: { transport: daemons, launcher: daemons, daemons } });
      daemon = HostDaemon.start({
        host: 0,
        controller: harness.server.endpoint,
        stagingBytes: 1 << 20,
        listen: { host: "127.0.0.1", port: 0 },
        heartbeatMs: 100,
        retryMs: 200,
      });
      await daemon.ready();
    });
    afterAll(async () => {
      await daemon.close();
      await harness.close();
    });

    it(
      "runs examples/ddp/train.py from the install to its end, with the addon's CRC32C that the launcher names",
      async () => {
        const out = join(dir, "train.json");
        const launch = spawn(
          process.execPath,
          [
            ...CLI,
            "launch",
            "--job",
            "pip",
            "--host",
            "0",
            "--dp",
            "1",
            "--connect",
            harness.server.endpoint,
            "--checkpoint-bytes",
            String(8 * 2 ** 20),
            "--master-port",
            String(await freePort()),
            "--",
            python,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "1",
            train,
            "--steps",
            "5",
            "--out",
            out,
          ],
          { cwd: dir, env, stdio: ["ignore", "pipe", "pipe"] },
        );
        let stderr = "";
        launch.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
        launch.stdout.resume();
        const code = await new Promise<number | null>((resolve) => launch.once("close", resolve));
        expect(code, stderr).toBe(0);
        expect(stderr).toMatch(/training ended; the job is finished/);
        expect(JSON.parse(readFileSync(out, "utf8"))).toMatchObject({ step: 5, worldSize: 1, generation: 0 });
        // The hook looks the library up at attach and says so there when it has to fall back.
        expect(stderr).not.toMatch(/MONKEYTREE_CRC32C_LIB|torch CRC32C/);
      },
      3 * SAFETY_NET_MS,
    );
  });
});

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { loadKeyring } from "../../controller/service/keys.ts";
import { runCli, type CliResult } from "../helpers/cli.ts";
import { closeControllersAfterEach, startController, tempDirsPerTest } from "../service/harness.ts";

/**
 * Every bad input a user can give a command gets one line naming the flag and what to do, and
 * its exit code (2 unless the command documents another), never a stack trace or a hang.
 */

const tempDir = tempDirsPerTest();
closeControllersAfterEach();
afterEach(() => {
  vi.unstubAllEnvs();
});

/** The message line: everything on stderr but log lines (`[daemon 0] …`) and main's pointer to --help. */
function expectOneLine(result: Pick<CliResult, "code" | "stderr">, code: number, command: string, ...parts: (string | RegExp)[]): void {
  expect(result.stderr).not.toMatch(/^\s+at /m);
  expect(result.stderr).not.toContain("internal error");
  const lines = result.stderr.split("\n").filter((line) => line !== "" && !line.startsWith("[") && !line.startsWith("Run `monkeytree"));
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(new RegExp(`^monkeytree ${command}: `));
  for (const part of parts) expect(lines[0]).toMatch(part);
  expect(result.code, result.stderr).toBe(code);
}

const binary = join(import.meta.dirname, "../../dist/cli/monkeytree.js");
/** A process that would hang is killed past this, which the test then reports; it never waits for a healthy one. */
const HANG_MS = 30_000;

/** Runs the built CLI as a user does, with `env` added to (or, with `PATH`, replacing parts of) the environment. */
function runBinary(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult & { signal: NodeJS.Signals | null }> {
  expect(existsSync(binary), "dist/ is not built; run `npm run build`").toBe(true);
  const child = spawn(process.execPath, ["bin/monkeytree.js", ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), HANG_MS);
  return new Promise((resolve) =>
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, signal, stdout, stderr });
    }),
  );
}

/** A TCP port something else holds for the test's length. */
async function portInUse(): Promise<{ port: number; server: Server }> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { port: (server.address() as { port: number }).port, server };
}

const torchrun = ["--", "torchrun", "--nproc-per-node", "1", "train.py"];
/** Stands in for torchrun where a launcher gets as far as starting it. */
const FAKE_TORCHRUN = join(import.meta.dirname, "../sdk/fixtures/fake-torchrun.mjs");
const launch = (...flags: string[]) => runCli("launch", "--job", "a", "--host", "0", "--dp", "1", ...flags, ...torchrun);
/** A small buffer, so a daemon that gets as far as allocating one takes little of /dev/shm. */
const daemon = (...flags: string[]) => runCli("daemon", "--host", "0", "--staging-bytes", String(1 << 20), ...flags);
/** An address no host has (TEST-NET-1, RFC 5737). */
const NOT_HERE = "192.0.2.1";

describe("a malformed ZeroMQ address", () => {
  const form = 'must be a ZeroMQ address \\(tcp://HOST:PORT, ipc://PATH or inproc://NAME\\), got "garbage"';

  it("is refused up front by status, launch and daemon, naming --connect", async () => {
    expectOneLine(await runCli("status", "--connect", "garbage"), 2, "status", new RegExp(`--connect ${form}`));
    expectOneLine(await launch("--connect", "garbage"), 2, "launch", new RegExp(`--connect ${form}`));
    expectOneLine(await daemon("--connect", "garbage", "--listen", "127.0.0.1:0"), 2, "daemon", new RegExp(`--connect ${form}`));
  });

  it(
    "ends the daemon process at once rather than leaving it running",
    async () => {
      const result = await runBinary(["daemon", "--host", "0", "--connect", "garbage", "--listen", "127.0.0.1:0"]);
      expect(result.signal).toBeNull();
      expectOneLine(result, 2, "daemon", /--connect must be a ZeroMQ address/);
    },
    2 * HANG_MS,
  );

  it("is refused from $MONKEYTREE_CONTROLLER and from the site configuration, naming where it came from", async () => {
    vi.stubEnv("MONKEYTREE_CONTROLLER", "tcp://controller");
    expectOneLine(await launch(), 2, "launch", /^monkeytree launch: \$MONKEYTREE_CONTROLLER must be a ZeroMQ address .*, got "tcp:\/\/controller"$/);
    vi.unstubAllEnvs();
    const config = join(tempDir(), "config.yaml");
    writeFileSync(config, "controller: controller:5555\n");
    vi.stubEnv("MONKEYTREE_CONFIG", config);
    expectOneLine(await daemon(), 2, "daemon", `config ${config} at controller: controller must be a ZeroMQ address`);
  });

  it("is refused as --bind, which alone may take port 0 or * for any free one", async () => {
    expectOneLine(
      await runCli("controller", "--bind", "tcp://127.0.0.1", "--journal", tempDir()),
      2,
      "controller",
      /--bind must be a ZeroMQ address \(tcp:\/\/HOST:PORT \(port 0 or \* for any free one\), ipc:\/\/PATH or inproc:\/\/NAME\), got "tcp:\/\/127\.0\.0\.1"/,
    );
    expectOneLine(await runCli("status", "--connect", "tcp://127.0.0.1:*"), 2, "status", /--connect must be a ZeroMQ address/);
  });
});

describe("an address this host cannot listen on", () => {
  it("controller --bind on a port in use: one line naming --bind and what to do, exit 2", async () => {
    const { port, server } = await portInUse();
    try {
      const result = await runCli("controller", "--bind", `tcp://127.0.0.1:${port}`, "--journal", tempDir());
      expectOneLine(result, 2, "controller", `--bind: cannot bind tcp://127.0.0.1:${port}: Address already in use; pick another --bind address`);
    } finally {
      server.close();
    }
  });

  it("controller --bind on an address of another host", async () => {
    const result = await runCli("controller", "--bind", `tcp://${NOT_HERE}:5555`, "--insecure", "--journal", tempDir());
    expectOneLine(result, 2, "controller", `--bind: cannot bind tcp://${NOT_HERE}:5555: Cannot assign requested address; pick another --bind address`);
  });

  it("daemon --listen on an address of another host, or a name that resolves to none", async () => {
    expectOneLine(
      await daemon("--listen", `${NOT_HERE}:0`),
      2,
      "daemon",
      `--listen ${NOT_HERE}:0: cannot listen on ${NOT_HERE}:0: EADDRNOTAVAIL`,
      "give --listen an address of this host, with a free port or 0",
    );
    expectOneLine(
      await daemon("--listen", "no-such-host.invalid:0"),
      2,
      "daemon",
      "--listen no-such-host.invalid:0: cannot resolve host",
      "give --listen an address of this host",
    );
  });
});

describe("a number past what the machine can do", () => {
  it("a staging buffer larger than /dev/shm: names the flag and the largest size there is", async () => {
    const message = (flag: string) =>
      new RegExp(`--${flag} 999999999999999 is more than /dev/shm holds \\((\\d+) bytes in all\\): give at most \\1, or make /dev/shm larger`);
    expectOneLine(await daemon("--staging-bytes", "999999999999999"), 2, "daemon", message("staging-bytes"));
    expectOneLine(await launch("--checkpoint-bytes", "999999999999999"), 2, "launch", message("checkpoint-bytes"));
  });

  it("demo --state-mb more than all its hosts' checkpoints fit in /dev/shm, refused before anything starts", async () => {
    const result = await runCli("demo", "--state-mb", "1e9");
    expectOneLine(
      result,
      2,
      "demo",
      /--state-mb 1e9 needs \d+ bytes of \/dev\/shm \(8 hosts × 3 checkpoints\), more than its \d+: give at most \d+, or make \/dev\/shm larger/,
    );
    expect(result.stdout).toBe("");
  });

  it("a duration longer than a timer holds, which would fire at once", async () => {
    expectOneLine(await runCli("status", "--timeout", "1e12"), 2, "status", `--timeout must be a number from 0.1 to 2147483, got "1e12"`);
    expectOneLine(await daemon("--heartbeat", "1e10"), 2, "daemon", `--heartbeat must be a number from 0.01 to 2147483, got "1e10"`);
    expectOneLine(await runCli("controller", "--heartbeat-timeout", "1e10"), 2, "controller", "--heartbeat-timeout must be a number from 0.1 to 2147483");
    expectOneLine(await runCli("plan", "--time-limit", "1e10"), 2, "plan", "--time-limit must be a number from 0.001 to 2147483");
  });

  it("simulate's link speed and expert-parallel factor past where its arithmetic stays finite", async () => {
    expectOneLine(await runCli("simulate", "--nic-gbps", "1e300"), 2, "simulate", `--nic-gbps must be a number from 0.001 to 100000, got "1e300"`);
    expectOneLine(await runCli("simulate", "--ep-factor", "1e300"), 2, "simulate", `--ep-factor must be a number from 0 to 1000, got "1e300"`);
  });
});

describe("an input that never ends", () => {
  it("a snapshot is read up to its limit, then refused", async () => {
    expectOneLine(await runCli("plan", "--snapshot", "/dev/zero"), 2, "plan", "snapshot /dev/zero: it holds more than the 16777216 bytes a snapshot may have");
  });

  it(
    "a credential that is a device, not a file, is refused rather than read forever",
    async () => {
      const result = await runBinary(["status", "--credentials", "/dev/zero"]);
      expect(result.signal).toBeNull();
      expectOneLine(result, 2, "status", "credential /dev/zero: it is not a regular file; `monkeytree keys` writes credential files");
    },
    2 * HANG_MS,
  );
});

describe("an output path that cannot be written", () => {
  it("keys --dir at a file says it is a file, not a directory", async () => {
    const file = join(tempDir(), "keys");
    writeFileSync(file, "");
    expectOneLine(
      await runCli("keys", "--dir", file, "--job", "a"),
      2,
      "keys",
      `--dir ${file}: it is a file, not a directory; give --dir a directory this user can write`,
    );
    expectOneLine(await runCli("keys", "--dir", join(file, "sub"), "--job", "a"), 2, "keys", `--dir ${join(file, "sub")}: ${file} is a file, not a directory`);
  });

  it("simulate --csv, --plot and --save-trace are checked before the simulation runs", async () => {
    const file = join(tempDir(), "taken");
    writeFileSync(file, "");
    for (const flag of ["--csv", "--plot", "--save-trace"]) {
      const result = await runCli("simulate", flag, file);
      expectOneLine(result, 2, "simulate", `${flag} ${file}: it is a file, not a directory; give ${flag} a directory this user can write`);
      // Progress lines (`[1/6] ecmp at load 0.5: 200 jobs in 0.1 s`) would show a run.
      expect(result.stderr).not.toContain("jobs in");
    }
  });

  it("plan --output at a directory is refused before planning", async () => {
    const dir = tempDir();
    expectOneLine(
      await runCli("plan", "--output", dir),
      2,
      "plan",
      `--output ${dir}: it is a directory, not a file; give --output a file path this user can write`,
    );
  });

  // mkdir under /proc says ENOENT of /proc itself, on which Node's recursive mkdir spins forever.
  it.each([
    ["simulate", "--plot"],
    ["simulate", "--csv"],
    ["controller", "--journal"],
    ["keys", "--dir"],
  ])(
    "%s %s /proc/x fails at once",
    async (command, flag) => {
      const extra = command === "keys" ? ["--job", "a"] : [];
      const result = await runBinary([command, flag, "/proc/x", ...extra]);
      expect(result.signal).toBeNull();
      expectOneLine(result, 2, command, `${flag} /proc/x: cannot create /proc/x (no such file or directory); give ${flag} a directory this user can write`);
    },
    2 * HANG_MS,
  );

  it("plan --output /proc/x fails before planning", async () => {
    expectOneLine(await runCli("plan", "--output", "/proc/x"), 2, "plan", "--output /proc/x: cannot write it (no such file or directory)");
  });
});

describe("Slurm's commands not installed", () => {
  /** A PATH with node and nothing of Slurm's. */
  function pathWithoutSlurm(): string {
    const bin = join(tempDir(), "bin");
    mkdirSync(bin);
    symlinkSync(process.execPath, join(bin, "node"));
    return bin;
  }
  const topology = () => {
    const file = join(tempDir(), "topology.conf");
    writeFileSync(file, "SwitchName=s1 Nodes=n[1-2]\n");
    return file;
  };
  const missing =
    /sinfo is not installed here \(not on PATH\): install Slurm's client commands \(Debian and Ubuntu: apt install slurm-client, or slurm-wlm with the daemons\) or add their directory to PATH$/;

  it(
    "monkeytree slurm says which command is missing and what to install, exit 2",
    async () => {
      const result = await runBinary(["slurm", "--topology", topology(), "--uplinks-per-rack", "1"], { PATH: pathWithoutSlurm() });
      expectOneLine(result, 2, "slurm", missing);
    },
    2 * HANG_MS,
  );

  it("controller --scheduler slurm says so before it starts", async () => {
    vi.stubEnv("PATH", pathWithoutSlurm());
    const result = await runCli("controller", "--scheduler", "slurm", "--topology", topology(), "--uplinks-per-rack", "1", "--journal", tempDir());
    expectOneLine(result, 2, "controller", /^monkeytree controller: --scheduler slurm: /, missing);
  });
});

describe("a client a keyed controller refuses", () => {
  async function keyedController(): Promise<{ endpoint: string; keys: string }> {
    const keys = join(tempDir(), "keys");
    expect((await runCli("keys", "--dir", keys, "--daemon", "0", "--operator", "ops")).code).toBe(0);
    const harness = await startController({ overrides: { keyring: loadKeyring(keys) } });
    return { endpoint: harness.server.endpoint, keys };
  }

  it("a daemon without credentials says once that the controller refused it, and which flag gives them", async () => {
    const { endpoint } = await keyedController();
    vi.stubEnv("MONKEYTREE_CREDENTIALS", "");
    const result = await daemon("--connect", endpoint);
    expectOneLine(
      result,
      2,
      "daemon",
      `the controller at ${endpoint} has a keyring and refused this client, which gave no credential: give --credentials the daemon-0.json that \`monkeytree keys --daemon 0\` wrote, or set $MONKEYTREE_CREDENTIALS to it`,
    );
    expect(result.stderr.match(/refused/g)).toHaveLength(1);
  });

  it("a daemon whose key the keyring does not list is told so", async () => {
    const { endpoint, keys } = await keyedController();
    // Issued after the controller loaded its keyring.
    expect((await runCli("keys", "--dir", keys, "--daemon", "1")).code).toBe(0);
    const credential = join(keys, "daemon-1.json");
    const result = await runCli("daemon", "--host", "1", "--staging-bytes", String(1 << 20), "--connect", endpoint, "--credentials", credential);
    expectOneLine(
      result,
      2,
      "daemon",
      `the controller at ${endpoint} refused this client's credential: its keyring does not list the credential's key (${credential})`,
    );
  });

  it("launch without credentials says so at once, not at its registration's deadline, with the daemon's advice", async () => {
    const { endpoint } = await keyedController();
    vi.stubEnv("MONKEYTREE_CREDENTIALS", "");
    const log = join(tempDir(), "torchrun.jsonl");
    const result = await runCli(
      "launch",
      "--job",
      "a",
      "--host",
      "0",
      "--dp",
      "1",
      "--connect",
      endpoint,
      "--checkpoint-bytes",
      "65536",
      "--",
      FAKE_TORCHRUN,
      "--log",
      log,
    );
    expectOneLine(
      result,
      2,
      "launch",
      `the controller at ${endpoint} has a keyring and refused this client, which gave no credential: give --credentials the job-a.json that \`monkeytree keys --job a\` wrote, or set $MONKEYTREE_CREDENTIALS to it`,
    );
  });

  it("status without credentials answers at once, not at its deadline", async () => {
    const { endpoint } = await keyedController();
    vi.stubEnv("MONKEYTREE_CREDENTIALS", "");
    // A deadline past the test's own timeout: only the refusal can end the wait.
    const result = await runCli("status", "--connect", endpoint, "--timeout", "600");
    expectOneLine(result, 3, "status", "has a keyring and refused this client, which gave no credential: give --credentials the operator-NAME.json");
  });
});

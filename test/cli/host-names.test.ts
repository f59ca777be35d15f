import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { errorReply } from "../../sdk/contract/protocol/errors.ts";
import { runCli } from "../helpers/cli.ts";
import { FakeController } from "../helpers/fake-controller.ts";

// `monkeytree launch` under srun: no flags but the command. Its job, host (by name, through the
// site configuration's topology), DP size and stage come from Slurm's environment, the
// controller's address from $MONKEYTREE_CONTROLLER; the fake controller reads the registration.

const CHANNEL_SCRIPT = new URL("../sdk/fixtures/channel-script.mjs", import.meta.url).pathname;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function environment(env: Record<string, string>): void {
  Object.assign(process.env, env);
  cleanups.push(() => {
    for (const name of Object.keys(env)) delete process.env[name];
  });
}

function site(): string {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-site-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "topology.conf"), "SwitchName=r0 Nodes=n[0-3]\nSwitchName=r1 Nodes=n[4-7]\nSwitchName=top Switches=r[0-1]\n");
  writeFileSync(join(dir, "config.yaml"), `topology: ${join(dir, "topology.conf")}\n`);
  return join(dir, "config.yaml");
}

/** The registration a launch sends; the controller then refuses it, so the launch exits 1. */
async function registration(...argv: string[]): Promise<{ message: Record<string, unknown>; code: number; stderr: string }> {
  const fake = await FakeController.start();
  cleanups.push(() => fake.close());
  environment({ MONKEYTREE_CONTROLLER: fake.endpoint, CHANNEL_SCRIPT: "[]" });
  const run = runCli("launch", ...argv, "--", CHANNEL_SCRIPT, "--log", "/dev/null");
  const message = await fake.next("worker.register");
  await fake.send(errorReply(message.id as number, "conflict", "seen"));
  const result = await run;
  return { message, code: result.code, stderr: result.stderr };
}

describe("monkeytree launch under srun", () => {
  it("takes job, host name, DP size and stage from Slurm's environment", async () => {
    environment({ MONKEYTREE_CONFIG: site(), SLURM_JOB_ID: "42", SLURMD_NODENAME: "n5", SLURM_JOB_NODELIST: "n[1-2,4-5]" });
    const { message, code, stderr } = await registration();
    expect(message).toMatchObject({ worker: { job: "42", host: 5, group: 0 }, parallelism: { tp: 1, pp: 1, dp: 4 } });
    expect(code).toBe(1);
    expect(stderr).toContain("seen");
  });

  it("splits the allocation into --pp stages of consecutive nodes", async () => {
    environment({ MONKEYTREE_CONFIG: site(), SLURM_JOB_ID: "7", SLURMD_NODENAME: "n4", SLURM_JOB_NODELIST: "n[1-2,4-5]" });
    const { message } = await registration("--pp", "2", "--tp", "8");
    expect(message).toMatchObject({ worker: { job: "7", host: 4, group: 1 }, parallelism: { tp: 8, pp: 2, dp: 2 } });
  });

  it("lets flags override the environment", async () => {
    environment({ MONKEYTREE_CONFIG: site(), SLURM_JOB_ID: "42", SLURMD_NODENAME: "n5", SLURM_JOB_NODELIST: "n[4-5]" });
    const { message } = await registration("--job", "llama", "--host", "n0", "--dp", "3");
    expect(message).toMatchObject({ worker: { job: "llama", host: 0 }, parallelism: { dp: 3 } });
  });

  it.each([
    [{ SLURM_JOB_ID: "42", SLURM_JOB_NODELIST: "n[4-5]" }, "SLURM_JOB_ID is set but SLURMD_NODENAME is not"],
    [{ SLURM_JOB_ID: "42", SLURMD_NODENAME: "n9", SLURM_JOB_NODELIST: "n9" }, 'host "n9" is not in the topology; it names 8 hosts (n0, n1, n2, …)'],
    [{ SLURM_JOB_ID: "42", SLURMD_NODENAME: "n4", SLURM_JOB_NODELIST: "n[4-6]" }, "the allocation has 3 nodes, which --pp 2 does not divide: give --dp"],
  ])("exits 2 naming what is wrong with %j", async (env, message) => {
    environment({ MONKEYTREE_CONFIG: site(), ...env });
    const result = await runCli("launch", "--pp", "2", "--", CHANNEL_SCRIPT);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
  });

  it("needs a topology to read a host name", async () => {
    environment({ MONKEYTREE_CONFIG: "/dev/null", SLURM_JOB_ID: "42", SLURMD_NODENAME: "n4", SLURM_JOB_NODELIST: "n4" });
    const result = await runCli("launch", "--", CHANNEL_SCRIPT);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(
      '--host must be a whole number ≥ 0 or, with a topology (--topology FILE, or "topology" in the site configuration $MONKEYTREE_CONFIG), a host\'s name; got "n4"',
    );
  });
});

describe("hosts by name in the other commands", () => {
  const conf = (): string => {
    const dir = mkdtempSync(join(tmpdir(), "monkeytree-site-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "topology.conf"), "SwitchName=r0 Nodes=n[0-1]\nSwitchName=r1 Nodes=n[2-3]\nSwitchName=top Switches=r[0-1]\n");
    return join(dir, "topology.conf");
  };

  it("keys writes daemon credentials for hosts named by a hostlist", async () => {
    const path = conf();
    const dir = mkdtempSync(join(tmpdir(), "monkeytree-keys-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const result = await runCli("keys", "--dir", dir, "--daemon", "n[1-2]", "--daemon", "3", "--topology", path);
    expect(result.code, result.stderr).toBe(0);
    expect(["daemon-1.json", "daemon-2.json", "daemon-3.json"].map((file) => existsSync(join(dir, file)))).toEqual([true, true, true]);
    expect(existsSync(join(dir, "daemon-0.json"))).toBe(false);
    expect((await runCli("keys", "--dir", dir, "--daemon", "n9", "--topology", path)).stderr).toContain('host "n9" is not in the topology');
  });

  it("a daemon refuses a name the topology does not hold", async () => {
    const result = await runCli("daemon", "--host", "n9", "--topology", conf());
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('monkeytree daemon: host "n9" is not in the topology; it names 4 hosts (n0, n1, n2, …)');
  });

  it("the controller reads a topology.conf only with the uplinks it does not hold", async () => {
    const path = conf();
    const result = await runCli("controller", "--topology", path);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(`${path} is a Slurm topology.conf, which does not say how many uplinks a rack has: add --uplinks-per-rack N`);
    expect((await runCli("controller", "--topology", path, "--snapshot", path)).stderr).toContain("--snapshot and --topology both give the topology: give one");
  });
});

describe("monkeytree controller --topology", () => {
  it("runs on a topology.conf's racks, with the uplinks given", async () => {
    const dir = mkdtempSync(join(tmpdir(), "monkeytree-site-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "topology.conf"), "SwitchName=r0 Nodes=n[0-2]\nSwitchName=r1 Nodes=n[3-4]\nSwitchName=top Switches=r[0-1]\n");
    const child = spawn(
      process.execPath,
      [
        "bin/run-ts.js",
        "cli/monkeytree.ts",
        "controller",
        "--topology",
        join(dir, "topology.conf"),
        "--uplinks-per-rack",
        "2",
        "--bind",
        "tcp://127.0.0.1:*",
        "--journal",
        join(dir, "journal"),
      ],
      {
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    cleanups.push(() => child.kill("SIGKILL"));
    const endpoint = await new Promise<string>((resolve) =>
      createInterface({ input: child.stdout! }).on("line", (line) => {
        const match = /^controller listening on (\S+)$/.exec(line);
        if (match?.[1]) resolve(match[1]);
      }),
    );
    const status = await runCli("status", "--connect", endpoint);
    // The shorter rack gets an empty third slot.
    expect(status.stdout).toContain("2 racks × 3 hosts × 8 GPUs, λ 2;");
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
  }, 60_000);
});

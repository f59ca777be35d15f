import { spawn } from "node:child_process";
import { chmodSync, existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { StatusReportSchema } from "../../sdk/contract/protocol/status.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { readCredential } from "../../sdk/contract/protocol/auth.ts";
import { JOURNAL_FILE } from "../../controller/service/journal.ts";
import { runCli } from "../helpers/cli.ts";
import { startController, tempDir, type Harness } from "./harness.ts";

let harness: Harness | undefined;
const dirs: string[] = [];
afterEach(async () => {
  await harness?.close();
  harness = undefined;
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe("monkeytree status", () => {
  it("prints what the controller holds, as text and as a JSON document", async () => {
    harness = await startController();
    const text = await runCli("status", "--connect", harness.server.endpoint);
    expect(text).toMatchObject({ code: 0, stderr: "" });
    expect(text.stdout).toBe(
      "2 racks × 4 hosts × 8 GPUs, λ 1; 0 jobs, 0 workers, 0 host daemons\nevery rack is within its bound\nroutes: every DP flow has its own links (0 DP flows)\njournal: 1 records\n",
    );
    const json = await runCli("status", "--connect", harness.server.endpoint, "--json");
    expect(StatusReportSchema.parse(JSON.parse(json.stdout))).toMatchObject({ lambda: 1, fragmentation: [0, 0], withinBounds: true });
  });

  it("exits 3 naming the address when no controller answers", async () => {
    const result = await runCli("status", "--connect", "tcp://127.0.0.1:9", "--timeout", "0.3");
    expect(result.code).toBe(3);
    expect(result.stderr).toContain("no answer to status #1 from tcp://127.0.0.1:9 within 300 ms");
  });
});

describe("monkeytree controller", () => {
  it("refuses a snapshot that lists jobs", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const file = join(dir, "snap.json");
    writeFileSync(file, JSON.stringify({ topology: { racks: 1, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 }, jobs: [{ id: "a", hosts: [0] }] }));
    const result = await runCli("controller", "--snapshot", file, "--journal", join(dir, "j"));
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('give it a snapshot with "jobs": []');
  });

  it("runs as a process with a keyring, answers only its operators, and stops cleanly on SIGTERM", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const keys = join(dir, "keys");
    expect((await runCli("keys", "--dir", keys, "--operator", "ops", "--job", "a")).code).toBe(0);
    const child = spawn(
      process.execPath,
      ["bin/monkeytree.js", "controller", "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal"), "--keys", keys],
      {
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const lines: string[] = [];
      const stderr: string[] = [];
      createInterface({ input: child.stderr! }).on("line", (line) => stderr.push(line));
      // Waits for the line, or fails at once if the controller exits first; the test's own
      // timeout is the safety net for a start that is merely slow on a loaded machine.
      const endpoint = await new Promise<string>((resolve, reject) => {
        void exited.then((code) => reject(new Error(`controller exited (${code}) before listening: ${stderr.join("\n")}`)));
        createInterface({ input: child.stdout! }).on("line", (line) => {
          lines.push(line);
          const match = /^controller listening on (\S+)$/.exec(line);
          if (match?.[1]) resolve(match[1]);
        });
      });
      const publicKey = (JSON.parse(readFileSync(join(keys, "controller.json"), "utf8")) as { publicKey: string }).publicKey;
      expect(lines[0]).toBe(`server key ${publicKey}, 2 client keys from ${keys}`);
      const ok = await runCli("status", "--connect", endpoint, "--credentials", join(keys, "operator-ops.json"));
      expect(ok, ok.stderr).toMatchObject({ code: 0, stdout: expect.stringContaining("16 racks × 8 hosts × 8 GPUs, λ 8") });
      const job = await runCli("status", "--connect", endpoint, "--credentials", join(keys, "job-a.json"));
      expect(job).toMatchObject({ code: 3, stderr: expect.stringContaining("status-needs-operator") });
      const refused = await runCli("status", "--connect", endpoint, "--timeout", "0.5");
      expect(refused.code).toBe(3);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
    expect(existsSync(join(dir, "journal", JOURNAL_FILE))).toBe(true);
  });

  it("refuses to bind anything but loopback without a keyring, saying how to make one", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const refused = await runCli("controller", "--bind", "tcp://*:0", "--journal", join(dir, "j"));
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("refusing to listen on tcp://*:0 without a keyring");
    expect(refused.stderr).toContain("monkeytree keys --dir keys");
    expect(existsSync(join(dir, "j"))).toBe(false);
  });
});

/** A controller process from the sources, its stderr lines, and a wait for one of them. */
async function controllerProcess(dir: string, ...args: string[]) {
  const child = spawn(
    process.execPath,
    ["bin/run-ts.js", "cli/monkeytree.ts", "controller", "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal"), ...args],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const stderr: string[] = [];
  const waiters: { pattern: RegExp; resolve: (line: string) => void }[] = [];
  createInterface({ input: child.stderr! }).on("line", (line) => {
    stderr.push(line);
    for (const w of waiters.filter((w) => w.pattern.test(line))) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve(line);
    }
  });
  /** The next stderr line matching `pattern` from now on; fails if the controller exits first. */
  const line = (pattern: RegExp) =>
    new Promise<string>((resolve, reject) => {
      waiters.push({ pattern, resolve });
      void exited.then((code) => reject(new Error(`controller exited (${code}) before logging ${pattern}: ${stderr.join("\n")}`)));
    });
  const endpoint = await new Promise<string>((resolve, reject) => {
    void exited.then((code) => reject(new Error(`controller exited (${code}) before listening: ${stderr.join("\n")}`)));
    createInterface({ input: child.stdout! }).on("line", (text) => {
      const match = /^controller listening on (\S+)$/.exec(text);
      if (match?.[1]) resolve(match[1]);
    });
  });
  return { child, exited, endpoint, line };
}

describe("monkeytree controller on SIGHUP", () => {
  it("reloads its keyring: an added key is admitted, a removed one refused on its open connection, a broken keyring kept out", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const keys = join(dir, "keys");
    expect((await runCli("keys", "--dir", keys, "--operator", "ops", "--job", "a")).code).toBe(0);
    const controller = await controllerProcess(dir, "--keys", keys);
    const revoked = new ControllerClient({ endpoint: controller.endpoint, credential: readCredential(join(keys, "job-a.json")), timeoutMs: 5_000 });
    try {
      const finish = (job: string, credential: string) =>
        runCli("job", "finish", "--job", job, "--connect", controller.endpoint, "--credentials", join(keys, credential));
      // Answered (the job is unknown), so job-a's key is admitted; job-b's does not exist yet.
      await expect(revoked.finish("a")).rejects.toMatchObject({ code: "unknown_job" });
      expect((await runCli("keys", "--dir", keys, "--job", "b")).code).toBe(0);
      expect(await finish("b", "job-b.json")).toMatchObject({ code: 3, stderr: expect.stringContaining("send the controller SIGHUP") });

      const keyringPath = join(keys, "controller.json");
      const keyring = JSON.parse(readFileSync(keyringPath, "utf8")) as { clients: { name: string }[] };
      writeFileSync(keyringPath, JSON.stringify({ ...keyring, clients: keyring.clients.filter((c) => c.name !== "job-a") }), { mode: 0o600 });
      let reloaded = controller.line(/SIGHUP: reloaded the keyring/);
      controller.child.kill("SIGHUP");
      expect(await reloaded).toContain("added job-b; revoked job-a");
      expect(await finish("b", "job-b.json")).toMatchObject({ code: 3, stderr: expect.stringContaining('job "b" is not known') });
      // The revoked key's connection stays open, and its next message is refused.
      await expect(revoked.finish("a")).rejects.toMatchObject({ code: "forbidden", message: expect.stringContaining("not in the controller's keyring") });

      reloaded = controller.line(/SIGHUP: kept the keyring in use/);
      writeFileSync(keyringPath, "{", { mode: 0o600 });
      controller.child.kill("SIGHUP");
      expect(await reloaded).toContain("cannot read it");
      reloaded = controller.line(/SIGHUP: kept the keyring in use/);
      writeFileSync(keyringPath, JSON.stringify(keyring), { mode: 0o600 });
      chmodSync(keyringPath, 0o644);
      controller.child.kill("SIGHUP");
      expect(await reloaded).toContain(`run \`chmod 600 ${keyringPath}\``);
      // The keyring in use is still the reloaded one: job-b in, job-a out, operators in.
      expect(await finish("b", "job-b.json")).toMatchObject({ code: 3, stderr: expect.stringContaining('job "b" is not known') });
      await expect(revoked.finish("a")).rejects.toMatchObject({ code: "forbidden" });
      expect((await runCli("status", "--connect", controller.endpoint, "--credentials", join(keys, "operator-ops.json"))).code).toBe(0);
    } finally {
      await revoked.close();
      controller.child.kill("SIGTERM");
    }
    expect(await controller.exited).toBe(0);
  });

  it("logs and ignores SIGHUP without a keyring", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const controller = await controllerProcess(dir);
    try {
      const ignored = controller.line(/SIGHUP ignored: this controller has no keyring/);
      controller.child.kill("SIGHUP");
      await ignored;
      expect((await runCli("status", "--connect", controller.endpoint)).code).toBe(0);
    } finally {
      controller.child.kill("SIGTERM");
    }
    expect(await controller.exited).toBe(0);
  });
});

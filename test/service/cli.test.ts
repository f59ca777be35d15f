import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { StatusReportSchema } from "../../sdk/protocol/status.ts";
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
    expect(text.stdout).toBe("2 racks × 4 hosts × 8 GPUs, λ 1; 0 jobs, 0 workers, 0 host daemons\nevery rack is within its bound\nroutes: every DP flow has its own links (0 DP flows)\njournal: 1 records\n");
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
    const child = spawn(process.execPath, ["bin/monkeytree.js", "controller", "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal"), "--keys", keys], {
      stdio: ["ignore", "pipe", "pipe"],
    });
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

import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";

const ROOT = new URL("../../", import.meta.url).pathname;

/** The demo's worker program as a process, outside any daemon (no MONKEYTREE_* environment). */
function worker(...argv: string[]): { code: number | null; stdout: string; stderr: string } {
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("MONKEYTREE_")));
  const ran = spawnSync(process.execPath, ["bin/run-ts.js", "cli/demo/worker.ts", ...argv], { cwd: ROOT, env, encoding: "utf8", timeout: 60_000 });
  return { code: ran.status, stdout: ran.stdout, stderr: ran.stderr };
}

describe("the demo's worker program's command line", () => {
  it("answers --help from its flag table, within 100 columns", () => {
    const { code, stdout, stderr } = worker("--help");
    expect({ code, stderr }).toEqual({ code: 0, stderr: "" });
    expect(stdout).toMatch(/^usage: node dist\/cli\/demo\/worker\.js \[--controller ADDR\] \[--job J\]/);
    expect(stdout).toContain("  --state-bytes SIZE        the model and optimizer state to train and move (default 64MiB)\n");
    expect(stdout.split("\n").filter((line) => line.length > 100)).toEqual([]);
  }, 60_000);

  it.each([
    [["--steps", "ten"], `--steps must be a whole number ≥ 0, got "ten"`],
    [["--job", "a", "--host", "0", "--tp", "0"], `--tp must be a whole number ≥ 1, got "0"`],
    [["--host", "0"], "--job and --host are required, unless a daemon starts this as a replacement"],
    [["--job", "a", "--host", "0", "--pause-at", "1"], "--pause-at N and --resume-when-exists PATH go together"],
    [["--job", "a", "--host", "0", "--pause-at", "x", "--resume-when-exists", "/tmp/go"], `--pause-at must be a whole number ≥ 0, got "x"`],
    [["--job", "a", "--host", "0", "--nope"], "Unknown option '--nope'"],
  ])(
    "refuses %j before connecting, naming the flag, with exit 2",
    (argv, reason) => {
      const { code, stdout, stderr } = worker(...argv);
      expect({ code, stdout }).toEqual({ code: 2, stdout: "" });
      expect(stderr.split("\n")[0]).toContain(`demo worker: ${reason}`);
      expect(stderr).toContain("\nusage: node dist/cli/demo/worker.js");
    },
    60_000,
  );
});

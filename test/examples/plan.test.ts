import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";

// The example imports "monkeytree/planner" by name, so it runs the compiled package (dist/,
// built by `npm test` before the tests) with plain Node, as a user's script would.
const runExample = (...args: string[]) => spawnSync(process.execPath, ["examples/plan.js", ...args], { encoding: "utf8" });

describe("examples/plan.js", () => {
  it("runs with plain node as docs/planner.md shows and prints the plan and its routes", () => {
    const { status, stdout, stderr } = runExample();
    expect(stderr).toBe("");
    expect(status).toBe(0);
    expect(stdout).toMatch(/^optimal: 4 moves \(at least 4 needed\)$/m);
    expect(stdout).toMatch(/^after the plan: \d+ DP flows, at most 1 per link$/m);
    expect(stdout.trim().split("\n")).toHaveLength(6);
  });

  it("reports a bad snapshot in one line naming the field, exit 2", () => {
    const dir = mkdtempSync(join(tmpdir(), "monkeytree-example-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, "bad.json");
    writeFileSync(file, JSON.stringify({ topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: "eight" }, jobs: [] }));
    const { status, stdout, stderr } = runExample(file);
    expect(status).toBe(2);
    expect(stdout).toBe("");
    expect(stderr).toMatch(/^\S+bad\.json: snapshot at topology\.uplinksPerRack: .+\n$/);
  });
});

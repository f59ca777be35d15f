import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);

describe("bench:simulate's rack-size sweep", () => {
  it("runs every cell of the grid on the run threads and prints each, with - where uplinks exceed a rack's GPUs", async () => {
    const argv = [
      "bin/run-ts.js",
      "bench/simulate.ts",
      "--preset",
      "small",
      "--gpus-per-rack",
      "32,128",
      "--uplinks",
      "2,64",
      "--jobs",
      "20",
      "--threads",
      "2",
    ];
    const { stdout, stderr } = await run(process.execPath, argv, { timeout: 240_000 });
    // Four systems on 32-GPU racks with 2 uplinks, and on 128-GPU racks with 2 and 64.
    expect(stderr.trim().split("\n")).toHaveLength(12);
    const p99 = stdout.slice(stdout.indexOf("p99 slowdown"), stdout.indexOf("average slowdown")).trim().split("\n").slice(2);
    expect(p99.map((row) => row.trim().split(/\s+/).slice(0, 2).join(" "))).toEqual(
      ["ecmp", "perfect", "monkeytree", "spray"].flatMap((system) => [`${system} 32`, `${system} 128`]),
    );
    for (const row of p99) {
      const [, gpus, two, all] = row.trim().split(/\s+/);
      expect(Number(two)).toBeGreaterThanOrEqual(1);
      expect(all === "-").toBe(gpus === "32");
    }
    expect(stdout).toMatch(/12 runs in [\d.]+ s/);
  }, 300_000);
});

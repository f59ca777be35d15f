import { execFileSync } from "node:child_process";
import { describe, expect, it } from "vitest";

describe("examples/plan.ts", () => {
  it("runs as the README shows and prints the plan", () => {
    const out = execFileSync(process.execPath, ["bin/run-ts.js", "examples/plan.ts"], { encoding: "utf8" });
    expect(out).toMatch(/^optimal: 4 moves \(at least 4 needed\)$/m);
    expect(out.trim().split("\n")).toHaveLength(5);
  });
});

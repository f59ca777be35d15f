import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { CHECKED, checkImports, LAYERS, TIERS, type Violation } from "./helpers/architecture.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

const describeViolation = (v: Violation) => `${v.file}:${v.line}: imports "${v.specifier}" (${v.target}): ${v.rule}`;

function trackedSources(): string[] {
  const run = spawnSync("git", ["ls-files", "-z", "--", ...CHECKED], { cwd: ROOT, encoding: "utf8" });
  if (run.status !== 0) throw new Error(`git ls-files failed in ${ROOT}: ${run.stderr.trim() || run.error?.message}`);
  return run.stdout.split("\0").filter((file) => /\.(ts|mjs|js)$/.test(file));
}

describe("the import direction (test/helpers/architecture.ts)", () => {
  const files = trackedSources();
  const violations = files.flatMap((file) => checkImports(file, readFileSync(`${ROOT}${file}`, "utf8")));

  it("holds for every source file git tracks", () => {
    expect(files).toContain("native/index.ts");
    expect(files).toContain("bin/monkeytree.js");
    expect(violations.map(describeViolation)).toEqual([]);
  });

  it("names the file, the line and the rule of a layer broken by any kind of import", () => {
    const check = (file: string, source: string) => checkImports(file, source).map((v) => [v.line, v.target, v.rule]);
    expect(
      check("sdk/client/client.ts", `import { a } from "../contract/protocol/codec.ts";\nimport {\n  b,\n} from "../../controller/planner/plan/index.ts";`),
    ).toEqual([[4, "controller/planner/plan/index.ts", "sdk/ may import only sdk/, native/ (layers, bottom to top: native ← sdk ← controller ← cli)"]]);
    expect(check("native/index.ts", `const m = require("../sdk/contract/log.ts");`)).toEqual([
      [1, "sdk/contract/log.ts", expect.stringMatching(/^native\/ may import only native\//)],
    ]);
    expect(check("cli/main.ts", `export * from "../test/helpers/cli.ts";`)).toEqual([
      [1, "test/helpers/cli.ts", expect.stringMatching(/^cli\/ may import only cli\//)],
    ]);
    expect(check("bench/plan.ts", `const f = new URL("../examples/snapshots/x.json", import.meta.url);`)).toEqual([
      [1, "examples/snapshots/x.json", expect.stringMatching(/^bench\/ may import only bench\/, native\//)],
    ]);
    expect(
      check("examples/plan.ts", `const { createPlanner } = await import("../controller/planner/plan/index.ts");\nimport { WorkerClient } from "monkeytree";`),
    ).toEqual([[1, "controller/planner/plan/index.ts", expect.stringContaining("import MonkeyTree by its package name")]]);
  });

  it("holds the finer order inside sdk/ and controller/", () => {
    const rules = (file: string, specifier: string) => checkImports(file, `import type { X } from "${specifier}";`).map((v) => v.rule);
    expect(rules("controller/planner/model/cluster.ts", "../plan/planner.ts")).toEqual([
      "inside controller/, controller/planner/model/ may import only nothing of its layer besides itself (see TIERS in test/helpers/architecture.ts)",
    ]);
    // Units of one tier are independent of each other.
    expect(rules("sdk/contract/protocol/codec.ts", "../checkpoint/index.ts")).toEqual([
      expect.stringMatching(/^inside sdk\/, sdk\/contract\/protocol\/ may import only sdk\/contract\/errors.ts/),
    ]);
    // A file no tier names is an entry point, above every tier.
    expect(rules("sdk/client/client.ts", "../index.ts")).toHaveLength(1);
    expect(rules("sdk/index.ts", "./client/launch/launcher.ts")).toEqual([]);
    expect(rules("controller/service/server.ts", "../planner/plan/planner.ts")).toEqual([]);
    expect(rules("cli/plan.ts", "./snapshots/x.json")).toEqual([]);
    // The repository root is no layer: the CLI finds its own entry points from there.
    expect(checkImports("cli/paths.ts", `const ROOT = new URL("../", import.meta.url);`)).toEqual([]);
  });

  it("exports from the package the entries docs/architecture.md names, each a source file", () => {
    const section = readFileSync(`${ROOT}docs/architecture.md`, "utf8");
    const { exports } = JSON.parse(readFileSync(`${ROOT}package.json`, "utf8")) as { exports: Record<string, string | { default: string }> };
    const entries = Object.values(exports).flatMap((target) => (typeof target === "string" ? [] : [target.default]));
    expect(entries.length).toBeGreaterThan(0);
    for (const entry of entries) {
      const source = entry.replace(/^\.\/dist\//, "").replace(/\.js$/, ".ts");
      expect(existsSync(`${ROOT}${source}`), `${entry} has no source ${source}`).toBe(true);
      // A folder's index stands for the folder.
      expect(section, `docs/architecture.md does not name ${source}`).toMatch(new RegExp(`\`${source}\`|\`${source.replace(/index\.ts$/, "")}\``));
    }
  });

  it("is what docs/architecture.md shows", () => {
    const section = readFileSync(`${ROOT}docs/architecture.md`, "utf8");
    expect(section).toContain(LAYERS.map((layer) => `\`${layer}\``).join(" ← "));
    expect(section).toContain("test/architecture.test.ts");
    for (const [layer, tiers] of Object.entries(TIERS)) {
      for (const unit of tiers.flat()) expect(section, `docs/architecture.md's tree misses ${unit}`).toContain(unit.slice(layer.length + 1));
    }
  });
});

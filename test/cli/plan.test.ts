import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PlanDocumentSchema } from "../../controller/planner/plan/schema.ts";
import { runCli } from "../helpers/cli.ts";

const dir = mkdtempSync(join(tmpdir(), "monkeytree-cli-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string) => {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
};
const topology = { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 2 };

describe("monkeytree plan", () => {
  it("plans the embedded example with no arguments", async () => {
    const { code, stdout, stderr } = await runCli("plan");
    expect(code).toBe(0);
    expect(stderr).toContain("no --snapshot given: planning the embedded example");
    expect(stdout).toContain("optimal: 2 moves in 1 step, proved minimal");
    expect(stdout).toMatch(/r4\s+3\s+2\s+2\s+ok/);
  });

  it("prints the plan document with --json", async () => {
    const { code, stdout } = await runCli("plan", "--json", "--snapshot", "examples/snapshots/tp8-pp-1024gpu.json");
    expect(code).toBe(0);
    const doc = PlanDocumentSchema.parse(JSON.parse(stdout));
    expect(doc).toMatchObject({ status: "optimal", moveCount: 4, steps: 1, lambda: 16 });
    expect(doc.fragmentation.after.every((d) => d <= 16)).toBe(true);
  });

  it.each([
    ["not JSON", "{ nope", /: not valid JSON/],
    ["unknown field", JSON.stringify({ topology, jobs: [], colour: 1 }), /unknown field "colour"/],
    ["host out of range", JSON.stringify({ topology, jobs: [{ id: "a", hosts: [8] }] }), /at jobs\[0\]\.hosts\[0\]: host 8 is out of range/],
    ["host used twice", JSON.stringify({ topology, jobs: [{ id: "a", hosts: [1, 1] }] }), /at jobs\[0\]\.hosts\[1\]: host 1 is already used/],
    ["negative numbers", JSON.stringify({ topology, lambda: -2, jobs: [] }), /at lambda: lambda must not be negative/],
  ])("rejects a snapshot with %s: one line, exit 2", async (name, text, pattern) => {
    const path = file(`${name.replace(/ /g, "-")}.json`, text);
    const { code, stdout, stderr } = await runCli("plan", "--snapshot", path);
    expect(code).toBe(2);
    expect(stdout).toBe("");
    expect(stderr).toMatch(pattern);
    expect(stderr.trim().split("\n")).toHaveLength(1);
    expect(stderr).toContain(`snapshot ${path}`);
  });

  it("rejects a missing file, a bad flag and a bad time limit", async () => {
    expect((await runCli("plan", "--snapshot", join(dir, "absent.json"))).stderr).toMatch(/cannot read it \(no such file\)/);
    const bad = await runCli("plan", "--frobnicate");
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/Unknown option '--frobnicate'[\s\S]*monkeytree plan --help/);
    expect((await runCli("plan", "--time-limit", "soon")).stderr).toMatch(/--time-limit must be a number/);
    expect((await runCli("plan", "--formulation", "cbc")).stderr).toMatch(/--formulation must be monkeytree or paper/);
  });

  it("exits 1 when no placement meets the bounds", async () => {
    const path = file(
      "infeasible.json",
      JSON.stringify({
        topology: { racks: 3, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
        jobs: [
          { id: "a", hosts: [0, 1, 2] },
          { id: "b", hosts: [3, 4, 5] },
        ],
      }),
    );
    const { code, stdout } = await runCli("plan", "--snapshot", path);
    expect(code).toBe(1);
    expect(stdout).toContain("infeasible: no placement of these jobs meets the bounds");
  });

  it("names the racks pinned jobs keep over λ, in the summary and in --json, and keeps pins in --output", async () => {
    const path = file(
      "pinned.json",
      JSON.stringify({
        topology: { racks: 3, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 },
        unavailable: [3],
        jobs: [
          { id: "a", hosts: [0, 4], movable: false },
          { id: "b", hosts: [1, 5], movable: false },
          { id: "c", hosts: [2, 8, 9] },
        ],
      }),
    );
    const human = await runCli("plan", "--snapshot", path);
    expect(human.code).toBe(0);
    expect(human.stdout).toContain("optimal: 1 move in 1 step");
    expect(human.stdout).toContain("best effort: pinned jobs (movable: false) keep these over their bound");
    expect(human.stdout).toContain("r0: pinned jobs alone give it 2 > λ = 1; 2 after the plan (1 over)");
    expect(human.stdout).toContain("r1: pinned jobs alone give it 2 > λ = 1; 2 after the plan (1 over)");
    const json = await runCli("plan", "--json", "--snapshot", path);
    const doc = PlanDocumentSchema.parse(JSON.parse(json.stdout));
    expect(doc.bestEffort).toEqual({
      racks: [
        { index: 0, cause: "pinned", pinned: 2, after: 2 },
        { index: 1, cause: "pinned", pinned: 2, after: 2 },
      ],
      pods: [],
    });
    expect(doc.moves).toEqual([{ job: "c", group: 0, from: 2, to: 10, step: 0 }]);
    const out = join(dir, "pinned-after.json");
    expect((await runCli("plan", "--snapshot", path, "--output", out)).code).toBe(0);
    const again = await runCli("plan", "--json", "--snapshot", out);
    expect(PlanDocumentSchema.parse(JSON.parse(again.stdout))).toMatchObject({ status: "unchanged", bestEffort: doc.bestEffort });
  });

  it("writes the snapshot after the plan with --output, ready for routes", async () => {
    const out = join(dir, "after.json");
    const { code } = await runCli("plan", "--snapshot", "examples/snapshots/tp8-pp-1024gpu.json", "--output", out);
    expect(code).toBe(0);
    const routes = await runCli("routes", "--snapshot", out);
    expect(routes.code).toBe(0);
    expect((await runCli("plan", "--output", join(dir, "no/such/dir/x.json"))).stderr).toMatch(
      /--output .*: cannot write it \(no such file or directory\); give --output a file path/,
    );
  });

  it("documents itself", async () => {
    const { code, stdout } = await runCli("plan", "--help");
    expect(code).toBe(0);
    expect(stdout).toContain("--time-limit SEC");
    expect((await runCli("--help")).stdout).toContain("plan");
    expect((await runCli("launch-rockets")).code).toBe(2);
    const { version } = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string };
    for (const flag of ["--version", "-V"]) expect(await runCli(flag)).toMatchObject({ code: 0, stdout: `monkeytree ${version}\n` });
  });
});

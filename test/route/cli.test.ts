import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { toSnapshot } from "../../controller/planner/model/index.ts";
import { RoutesSchema } from "../../controller/planner/route/index.ts";
import { runCli } from "../helpers/cli.ts";
import { syntheticCluster } from "../../controller/simulator/synthetic.ts";

const dir = mkdtempSync(join(tmpdir(), "monkeytree-routes-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string, value: unknown) => {
  const path = join(dir, name);
  writeFileSync(path, typeof value === "string" ? value : JSON.stringify(value));
  return path;
};
const topology = { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 2 };

describe("monkeytree routes", () => {
  it("prints a document that parses with the routes schema under --json", async () => {
    const cluster = syntheticCluster({ racks: 8, hostsPerRack: 4, uplinksPerRack: 4, rings: 2, racksPerPod: 4, podLambda: 8 }, 2);
    const { code, stdout, stderr } = await runCli("routes", "--json", "--snapshot", file("pods.json", toSnapshot(cluster)));
    expect(stderr).toBe("");
    expect(code).toBe(0);
    const routes = RoutesSchema.parse(JSON.parse(stdout));
    expect(routes.tiers).toBe(3);
    expect(routes.isolated).toBe(true);
    expect(routes.dpFlows.length).toBeGreaterThan(0);
  });

  it("prints the rack table and one line per flow by default", async () => {
    const snapshot = { topology, jobs: [{ id: "a", rings: 2, hosts: [3, 4] }] };
    const { code, stdout } = await runCli("routes", "--snapshot", file("two-racks.json", snapshot));
    expect(code).toBe(0);
    expect(stdout).toContain("2-tier Clos, 2 uplinks per rack; Δ = 2 colours");
    expect(stdout).toContain("isolated: every DP flow has its own uplink and downlink (4 DP flows)");
    expect(stdout).toMatch(/rack\s+DP out\s+DP in\s+uplinks\s+max\/uplink\s+max\/downlink/);
    // Job a, group 0: rings 0 and 1, each rack 0 → 1 and back, each on its own uplink.
    const lines = stdout.split("\n").filter((line) => /^\s+a\s/.test(line));
    expect(lines).toHaveLength(4);
    const rackUplinks = lines.map((line) => {
      const cells = line.trim().split(/\s+/);
      return `${cells[3]} ${cells[5]}`;
    });
    expect(new Set(rackUplinks).size).toBe(4);
  });

  it("exits 1 and names the racks when a snapshot exceeds its uplinks", async () => {
    const snapshot = { topology, lambda: 8, jobs: [{ id: "a", rings: 4, hosts: [3, 4] }] };
    const { code, stdout } = await runCli("routes", "--snapshot", file("over.json", snapshot));
    expect(code).toBe(1);
    expect(stdout).toContain("not isolated: up to 2 DP flows share a link on racks 0, 1");
  });

  it.each([
    ["not JSON", "{ nope", /: not valid JSON/],
    ["host out of range", JSON.stringify({ topology, jobs: [{ id: "a", hosts: [8] }] }), /at jobs\[0\]\.hosts\[0\]: host 8 is out of range/],
  ])("rejects a snapshot with %s: one line, exit 2", async (name, text, pattern) => {
    const { code, stdout, stderr } = await runCli("routes", "--snapshot", file(`${name.replace(/ /g, "-")}.json`, text));
    expect(code).toBe(2);
    expect(stdout).toBe("");
    expect(stderr).toMatch(pattern);
    expect(stderr.trimEnd().split("\n")).toHaveLength(1);
    expect(stderr).not.toMatch(/\n\s+at /);
  });

  it("rejects a missing file and a missing --snapshot with exit 2", async () => {
    const missing = await runCli("routes", "--snapshot", join(dir, "absent.json"));
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/cannot read it \(no such file\)/);
    const bare = await runCli("routes");
    expect(bare.code).toBe(2);
    expect(bare.stderr).toContain("--snapshot FILE is required");
  });
});

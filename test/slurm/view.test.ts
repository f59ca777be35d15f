import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { parseTopologyFile } from "../../controller/planner/model/named-topology.ts";
import { holdJob, holdName } from "../../controller/schedulers/slurm/commands.ts";
import { parseReservations, parseSinfo, parseSqueue } from "../../controller/schedulers/slurm/reports.ts";
import { slurmView, type ViewInput } from "../../controller/schedulers/slurm/view.ts";
import { InvalidInputError } from "../../sdk/contract/errors.ts";

// What Slurm 22.05 printed (test/slurm/fixtures, captured from the real cluster of
// test/helpers/slurm.ts): job 1 runs on n0 and n2 with `--comment=monkeytree:rings=4`, job 2
// waits, n3 is drained, and a MonkeyTree hold for job 1 reserves n1.
const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");
const nodes = parseSinfo(fixture("sinfo.json"));
const jobs = parseSqueue(fixture("squeue.json"));
const reservations = parseReservations(fixture("reservations.txt"));
// Racks of three slots: r0 holds n0 n1, r1 n2 n3 login (login is no Slurm node).
const topology = parseTopologyFile({
  gpusPerHost: 8,
  uplinksPerRack: 2,
  racks: [
    { name: "r0", hosts: "n[0-1]" },
    { name: "r1", hosts: ["n2", "n3", "login"] },
  ],
});
const input = (change: Partial<ViewInput> = {}): ViewInput => ({ topology, nodes, jobs, managed: new Set(), held: new Set(), reserved: new Map(), ...change });

describe("Slurm's reports", () => {
  it("reads nodes, jobs and reservations as 22.05 writes them", () => {
    expect(nodes).toEqual([
      { name: "n0", state: "allocated", flags: [], reason: "" },
      { name: "n1", state: "idle", flags: [], reason: "" },
      { name: "n2", state: "allocated", flags: [], reason: "" },
      { name: "n3", state: "idle", flags: ["DRAIN"], reason: "bad_dimm" },
    ]);
    expect(jobs).toEqual([
      { id: "1", state: "RUNNING", nodes: ["n0", "n2"], batchHost: "n0", comment: "monkeytree:rings=4", user: "root" },
      { id: "2", state: "PENDING", nodes: [], batchHost: "", comment: "", user: "root" },
    ]);
    expect(reservations).toEqual([{ name: "monkeytree-1-p0-0", nodes: ["n1"], users: ["root"], flags: ["IGNORE_JOBS", "SPEC_NODES"] }]);
    expect(holdJob(reservations[0]!.name)).toBe("1");
    expect(holdName("1", "p0/0")).toBe("monkeytree-1-p0-0");
    expect(holdJob("maintenance")).toBeNull();
    expect(parseReservations("No reservations in the system\n")).toEqual([]);
  });

  it("refuses output it cannot read, saying what was expected", () => {
    expect(() => parseSinfo("sinfo: error: unrecognized option")).toThrow(InvalidInputError);
    expect(() => parseSinfo("sinfo: error")).toThrow(/is this Slurm 22.05 or later, with the serializer\/json plugin\?/);
    expect(() => parseSqueue(JSON.stringify({ jobs: [{ job_id: "x" }] }))).toThrow(/^squeue --json at jobs\[0\]\.job_id: /);
    expect(() => parseSqueue(JSON.stringify({ jobs: [{ job_id: 1, job_state: "RUNNING", nodes: "n[0-" }] }))).toThrow(/jobs\[0\]\.nodes: hostlist/);
  });
});

describe("the view the planner gets", () => {
  it("pins a job that did not register, and keeps every node Slurm could hand out from being a destination", () => {
    const view = slurmView(input());
    expect(view.pinned).toEqual([{ id: "1", rings: 4, hosts: [0, 3] }]);
    expect(view.unavailable).toEqual([
      { host: 0, why: "allocated to Slurm job 1" },
      { host: 2, why: "an empty slot of a short rack" },
      { host: 3, why: "allocated to Slurm job 1" },
      { host: 4, why: "drain (bad_dimm)" },
      { host: 5, why: "Slurm does not report this node" },
    ]);
    expect(view.notes).toEqual([]);
  });

  it("moves a registered job's workers, onto its own nodes too (swaps)", () => {
    const view = slurmView(input({ managed: new Set(["1"]) }));
    expect(view.pinned).toEqual([]);
    expect(view.unavailable.map((u) => u.host)).toEqual([2, 4, 5]);
  });

  it("never plans onto another reservation's nodes, nor nodes Slurm marks down, reserved or planned", () => {
    expect(slurmView(input({ reserved: new Map([["n1", "maint"]]) })).unavailable).toContainEqual({ host: 1, why: "reserved (maint)" });
    const marked = nodes.map((n) =>
      n.name === "n1" ? { ...n, state: "down", reason: "not responding" } : n.name === "n2" ? { ...n, state: "idle", flags: ["PLANNED"] } : n,
    );
    const view = slurmView(input({ nodes: marked, jobs: [] }));
    expect(view.unavailable).toEqual([
      { host: 1, why: "down (not responding)" },
      { host: 2, why: "an empty slot of a short rack" },
      { host: 3, why: "planned" },
      { host: 4, why: "drain (bad_dimm)" },
      { host: 5, why: "Slurm does not report this node" },
    ]);
    const held = slurmView(input({ nodes: nodes.map((n) => (n.name === "n1" ? { ...n, flags: ["RESERVED"] } : n)), held: new Set(["n1"]) }));
    expect(held.unavailable.map((u) => u.host)).not.toContain(1);
  });

  it("reads rings from a job's comment, and counts a bad one as 1 with a note", () => {
    const comment = (text: string) => slurmView(input({ jobs: [{ ...jobs[0]!, comment: text }] }));
    expect(comment("team=x monkeytree:rings=8").pinned[0]?.rings).toBe(8);
    expect(comment("monkeytree:rings=8x").pinned[0]?.rings).toBe(1);
    expect(comment("").pinned[0]?.rings).toBe(1);
    const bad = comment("monkeytree:rings=99");
    expect(bad.pinned[0]?.rings).toBe(1);
    expect(bad.notes).toEqual(["Slurm job 1: monkeytree:rings=99 is not from 1 to 64; counted as 1"]);
  });

  it("believes a pinned job's comment only up to the GPUs it has on the rack where it has fewest", () => {
    // Job 1 has one 8-GPU host on each of two racks: at most 8 rings leave either rack.
    const comment = (text: string, nodes = jobs[0]!.nodes) => slurmView(input({ jobs: [{ ...jobs[0]!, comment: text, nodes }] }));
    const raised = comment("monkeytree:rings=64");
    expect(raised.pinned).toEqual([{ id: "1", rings: 8, hosts: [0, 3] }]);
    expect(raised.notes).toEqual([
      "Slurm job 1: monkeytree:rings=64 is more than its allocation carries (8 GPUs on the rack where it has fewest); counted as 8",
    ]);
    expect(comment("monkeytree:rings=2").pinned[0]?.rings).toBe(2);
    // Two hosts on r0 and two on r1: 16 GPUs on each.
    expect(comment("monkeytree:rings=16", ["n0", "n1", "n2", "n3"]).pinned[0]?.rings).toBe(16);
    expect(comment("monkeytree:rings=17", ["n0", "n1", "n2", "n3"]).pinned[0]?.rings).toBe(16);
  });

  it("counts every pinned job as 1 ring when the operator ignores comments", () => {
    const view = slurmView(input({ comments: "ignore" }));
    expect(view.pinned).toEqual([{ id: "1", rings: 1, hosts: [0, 3] }]);
    expect(view.notes).toEqual([]);
  });

  it("leaves out nodes outside the topology, saying which", () => {
    const outside = slurmView(input({ jobs: [{ ...jobs[0]!, nodes: ["n0", "gpu7"] }] }));
    expect(outside.pinned).toEqual([{ id: "1", rings: 4, hosts: [0] }]);
    expect(outside.notes).toEqual(["Slurm nodes outside the topology, left out: gpu7"]);
  });
});

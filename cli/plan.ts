import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { toSnapshot, type Cluster } from "../controller/planner/model/cluster.ts";
import { createPlanner, DEFAULT_TIME_LIMIT_MS, PlanTimeoutError, type Formulation, type Plan, type PlanProgress } from "../controller/planner/plan/index.ts";
import type { BestEffort, PlanDocument } from "../controller/planner/plan/schema.ts";
import { bool, checked, choice, helpText, parseCommandFlags, seconds, str } from "./flags.ts";
import { ExitCode, readSnapshotFile, table, UsageError, writeJson, type Command, type Io } from "./io.ts";
import { writableFile } from "./output.ts";
import { PACKAGE_ROOT } from "../sdk/contract/paths.ts";

/** The snapshot planned when none is given: a 1,024-GPU cluster where one rack went over λ = 2. */
export const EMBEDDED_SNAPSHOT = join(PACKAGE_ROOT, "cli/snapshots/dp-1024gpu-lambda2.json");

const formulations = ["monkeytree", "paper"] as const satisfies readonly Formulation[];

const FLAGS = {
  snapshot: str("FILE", `cluster snapshot (JSON, docs/planner.md); default: the embedded example ${EMBEDDED_SNAPSHOT}`),
  json: bool("print the plan as one JSON document instead of a summary"),
  "time-limit": seconds("SEC", 'wall-clock budget; past it the best valid plan found is returned with status "feasible"', {
    default: DEFAULT_TIME_LIMIT_MS / 1000,
    min: 0.001,
  }),
  formulation: choice(formulations, '"paper" solves the published program, which only moves fragmented groups', "monkeytree"),
  output: checked("FILE", "also write the snapshot as it stands after the plan (for `monkeytree routes`)", writableFile),
};

const help = helpText({
  command: "monkeytree plan",
  table: FLAGS,
  about: `Plans the fewest worker moves that bring every rack's fragmentation degree (and every pod's,
when the snapshot sets podLambda) within its bound, as concrete host moves in steps. Pinned
jobs ("movable": false) never move and unavailable hosts are never a destination; where they
leave no way within a bound, the plan is a best effort and names the racks it leaves over.`,
  after: `exit codes: 0 a plan (or nothing to do), 1 no plan (infeasible, or none found in time),
            2 bad usage or snapshot, 3 internal error`,
});

export const command: Command = {
  summary: "plan the fewest worker moves that restore the fragmentation bounds",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const path = flags.snapshot ?? EMBEDDED_SNAPSHOT;
    if (flags.snapshot === undefined && !flags.json) io.err.write(`no --snapshot given: planning the embedded example ${path}\n`);
    const cluster = await readSnapshotFile(path);
    const planner = await createPlanner();
    let plan: Plan;
    try {
      plan = planner.plan(cluster, { timeLimitMs: flags["time-limit"], formulation: flags.formulation, onProgress: (p) => progress(io, p) });
    } catch (error) {
      if (!(error instanceof PlanTimeoutError)) throw error;
      io.err.write(`monkeytree plan: ${error.message}\n`);
      return ExitCode.findings;
    }
    if (flags.output !== undefined) await writeSnapshot(flags.output, toSnapshot(cluster, plan.placement));
    if (flags.json) await writeJson(io, toDocument(cluster, plan));
    else io.out.write(`${summary(cluster, plan, path)}\n`);
    return plan.status === "infeasible" ? ExitCode.findings : ExitCode.ok;
  },
};

async function writeSnapshot(path: string, snapshot: unknown): Promise<void> {
  try {
    await writeFile(path, `${JSON.stringify(snapshot)}\n`);
  } catch (error) {
    throw new UsageError(`--output ${path}: cannot write it (${(error as NodeJS.ErrnoException).code ?? String(error)})`);
  }
}

/** Long plans say what is proven so far; quick ones (most) print nothing extra. */
function progress(io: Io, p: PlanProgress): void {
  if (p.elapsedMs < 500) return;
  const best = p.best === undefined ? "no plan yet" : `best plan so far ${p.best} moves`;
  const phase = { search: "exact search", repair: "quick repair", dive: "heuristic dive", ilp: "integer program (HiGHS) next" }[p.phase];
  io.err.write(`monkeytree plan: ${(p.elapsedMs / 1000).toFixed(1)} s: ${phase}; at least ${p.lowerBound} moves needed, ${best}\n`);
}

export function toDocument(cluster: Cluster, plan: Plan): PlanDocument {
  return {
    status: plan.status,
    moves: [...plan.moves],
    moveCount: plan.moveCount,
    steps: plan.steps,
    lowerBound: plan.lowerBound,
    method: plan.method,
    lambda: cluster.lambda,
    ...(plan.reason === undefined ? {} : { reason: plan.reason }),
    ...(cluster.podLambda === undefined ? {} : { podLambda: cluster.podLambda }),
    fragmentation: { before: [...plan.fragmentation.before], after: [...plan.fragmentation.after] },
    ...(plan.podFragmentation ? { podFragmentation: { before: [...plan.podFragmentation.before], after: [...plan.podFragmentation.after] } } : {}),
    ...(plan.bestEffort ? { bestEffort: { racks: [...plan.bestEffort.racks], pods: [...plan.bestEffort.pods] } } : {}),
    solveMs: Math.round(plan.solveMs * 1000) / 1000,
  };
}

function headline(plan: Plan): string {
  const ms = `${plan.solveMs.toFixed(1)} ms`;
  const moves = `${plan.moveCount} move${plan.moveCount === 1 ? "" : "s"} in ${plan.steps} step${plan.steps === 1 ? "" : "s"}`;
  switch (plan.status) {
    case "unchanged":
      return `unchanged: every rack is already within its bound; nothing to move (${ms})`;
    case "infeasible":
      return `infeasible: no placement of these jobs meets the bounds${plan.reason ? `: ${plan.reason}` : ""} (${ms})`;
    case "optimal":
      return `optimal: ${moves}, proved minimal (${ms})`;
    case "feasible":
      return `feasible: ${moves}; the time limit ran out before it was proved minimal (at least ${plan.lowerBound} needed) (${ms})`;
  }
}

function summary(cluster: Cluster, plan: Plan, path: string): string {
  const { racks, hostsPerRack, gpusPerHost, uplinksPerRack } = cluster.topology;
  const rack = (host: number) => `r${Math.floor(host / hostsPerRack)}`;
  const lines = [
    `snapshot ${path}: ${racks} racks × ${hostsPerRack} hosts × ${gpusPerHost} GPUs, ${uplinksPerRack} uplinks/rack, λ = ${cluster.lambda}` +
      (cluster.podLambda === undefined ? "" : `, pod λ = ${cluster.podLambda}`),
    headline(plan),
    ...bestEffortLines(cluster, plan),
  ];
  if (plan.moves.length > 0) {
    lines.push(
      "",
      table(
        ["step", "job", "group", "from", "to"],
        plan.moves.map((m) => [m.step, m.job, m.group, `${m.from} (${rack(m.from)})`, `${m.to} (${rack(m.to)})`]),
      ),
    );
  }
  lines.push("", degreeTable("rack", plan.fragmentation, cluster.lambda));
  if (plan.podFragmentation && cluster.podLambda !== undefined) lines.push("", degreeTable("pod", plan.podFragmentation, cluster.podLambda));
  return lines.join("\n");
}

/** What the plan could not reach because of pinned jobs, and what it held those domains to. */
function bestEffortLines(cluster: Cluster, plan: Plan): string[] {
  if (!plan.bestEffort) return [];
  const line = (name: string, bound: number | undefined) => (r: BestEffort["racks"][number]) =>
    `  ${name}${r.index}: ${r.cause === "pinned" ? `pinned jobs alone give it ${r.pinned} > λ = ${bound}` : `no room on the hosts a plan may use to bring it within λ = ${bound}`}; ` +
    `${r.after} after the plan (${r.after - (bound ?? 0)} over)`;
  const causes = new Set([...plan.bestEffort.racks, ...plan.bestEffort.pods].map((r) => r.cause));
  return [
    causes.has("no-room")
      ? "best effort: no placement meets every bound on the hosts a plan may use (unavailable hosts and pinned jobs take the rest); the plan leaves the least fragmentation over the bounds, with the fewest moves for it"
      : "best effort: pinned jobs (movable: false) keep these over their bound; the plan holds each to what its pinned jobs give it and every other rack and pod to its bound",
    ...plan.bestEffort.racks.map(line("r", cluster.lambda)),
    ...plan.bestEffort.pods.map(line("p", cluster.podLambda)),
  ];
}

/** Fragmentation of the domains that changed or are over the bound; the rest summarised. */
function degreeTable(name: string, degrees: Plan["fragmentation"], bound: number): string {
  const shown = degrees.before.flatMap((before, i) => {
    const after = degrees.after[i] ?? 0;
    return before !== after || before > bound || after > bound ? [[`${name[0]}${i}`, before, after, bound, after > bound ? "over" : "ok"]] : [];
  });
  const rest = degrees.before.length - shown.length;
  const max = degrees.after.reduce((a, b) => Math.max(a, b), 0);
  return [
    `fragmentation per ${name} (changed or over bound):`,
    shown.length ? table([name, "before", "after", "bound", ""], shown) : "  (none)",
    `${rest} other ${name}s unchanged; highest after: ${max}`,
  ].join("\n");
}

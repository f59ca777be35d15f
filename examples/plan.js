// Plans migrations for a snapshot file with the library API, imported by the package's name as
// an installed package is. Plain Node, no loader: node examples/plan.js [snapshot.json]
import fs from "node:fs";
import { createPlanner, InvalidInputError, parseSnapshot, routeCluster } from "monkeytree/planner";

const file = process.argv[2] ?? new URL("snapshots/tp8-pp-1024gpu.json", import.meta.url);
try {
  const cluster = parseSnapshot(JSON.parse(fs.readFileSync(file, "utf8"))); // InvalidInputError names the field
  const plan = (await createPlanner()).plan(cluster, { timeLimitMs: 2000 });
  process.stdout.write(`${plan.status}: ${plan.moveCount} moves (at least ${plan.lowerBound} needed)\n`);
  for (const move of plan.moves) process.stdout.write(`${move.job}[${move.group}] host ${move.from} → ${move.to}\n`);
  const routes = routeCluster({ ...cluster, placement: plan.placement });
  process.stdout.write(`after the plan: ${routes.dpFlows.length} DP flows, at most ${routes.overlap.maxFlowsPerLink} per link\n`);
} catch (error) {
  if (!(error instanceof InvalidInputError || error instanceof SyntaxError)) throw error;
  process.stderr.write(`${String(file)}: ${error.message}\n`);
  process.exitCode = 2;
}

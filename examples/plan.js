// Plans migrations for a snapshot file with the library API.
// Run: node bin/run-ts.js examples/plan.ts [snapshot.json]
import { readSnapshotFile } from "../cli/io.ts";
import { InvalidInputError } from "../controller/model/index.ts";
import { createPlanner } from "../controller/plan/index.ts";

const path = process.argv[2] ?? new URL("snapshots/tp8-pp-1024gpu.json", import.meta.url).pathname;
try {
  const cluster = await readSnapshotFile(path); // throws InvalidInputError naming file and field
  const planner = await createPlanner(); // loads the HiGHS solver once; plans are synchronous
  const plan = planner.plan(cluster, { timeLimitMs: 2000 });
  process.stdout.write(`${plan.status}: ${plan.moveCount} moves (at least ${plan.lowerBound} needed)\n`);
  for (const move of plan.moves) process.stdout.write(`${move.job}[${move.group}] host ${move.from} → ${move.to}\n`);
} catch (error) {
  if (!(error instanceof InvalidInputError)) throw error;
  process.stderr.write(`${error.message}\n`);
  process.exitCode = 2;
}

// Startup of the `monkeytree` command: `monkeytree plan` on the embedded 1,024-GPU example
// (about 3 ms of planning), run from source through tsx's loader, as bin/monkeytree.js did
// before the package was compiled, and from dist/ with plain Node, as it does now. Both ways
// run alternately in the same run, after one untimed run each (tsx caches its transforms on
// disk, so a warm cache is what a user sees from the second run on).
//
//   npm run bench:startup -- --runs 20
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { helpText, int, parseCommandFlags } from "../cli/flags.ts";
import { table } from "../cli/io.ts";
import { PACKAGE_ROOT, RUN_TS } from "../sdk/contract/paths.ts";
import { benchMain } from "./entry.ts";

const FLAGS = { runs: int("N", "timed runs of each", { default: 10, min: 1 }) };

const help = helpText({
  command: "npm run bench:startup --",
  table: FLAGS,
  about: `Times \`monkeytree plan\` on the embedded example from source through tsx and from the compiled
dist/ with plain Node (npm run bench:startup builds dist/ first).`,
});

const WAYS = [
  { name: "source through tsx", args: [RUN_TS, join(PACKAGE_ROOT, "cli/monkeytree.ts"), "plan"] },
  { name: "dist with plain node", args: [join(PACKAGE_ROOT, "bin/monkeytree.js"), "plan"] },
] as const;

function options(argv: string[]) {
  return parseCommandFlags(argv, FLAGS);
}

/** One run's wall time in ms; fails unless it planned the example. */
function timeRun(args: readonly string[]): number {
  const started = performance.now();
  const result = spawnSync(process.execPath, args, { encoding: "utf8" });
  const ms = performance.now() - started;
  if (result.status !== 0 || !/^optimal: 2 moves/m.test(result.stdout)) {
    throw new Error(`node ${args.join(" ")} exited ${result.status}:\n${result.stdout}${result.stderr}`);
  }
  return ms;
}

const median = (values: readonly number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

await benchMain("startup", help, options, ({ runs }) => {
  if (!existsSync(join(PACKAGE_ROOT, "dist/cli/monkeytree.js"))) {
    process.stderr.write("bench:startup: dist/ is not built; run `npm run build` (npm run bench:startup does)\n");
    return 2;
  }
  const times = WAYS.map(() => [] as number[]);
  for (const way of WAYS) timeRun(way.args);
  for (let run = 0; run < runs; run++) WAYS.forEach((way, i) => times[i]!.push(timeRun(way.args)));
  const medians = times.map(median);
  const ms = (value: number) => value.toFixed(0);
  process.stdout.write(
    `${table(
      ["monkeytree plan", "runs", "median ms", "min ms", "max ms"],
      WAYS.map((way, i) => [way.name, runs, ms(medians[i]!), ms(Math.min(...times[i]!)), ms(Math.max(...times[i]!))]),
    )}\n`,
  );
  process.stdout.write(`dist starts ${(medians[0]! / medians[1]!).toFixed(1)}× faster than source through tsx (medians)\n`);
  return 0;
});

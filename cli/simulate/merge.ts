import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { pooledMoveEvents, SimulationReportSchema, type SimulationReport, type SystemReport } from "../../controller/simulator/index.ts";

/**
 * `monkeytree simulate --merge`: the JSON reports of one preset's runs, made by separate
 * processes (one per seed, or the parts of a sweep split by variant or load), as one report per
 * seed. Nothing is dropped silently: a report of another preset, a seed's part run with other
 * settings, or a run two parts both hold is an error naming the files.
 */

export interface Part {
  readonly path: string;
  readonly text: string;
}

export function mergeReports(parts: readonly Part[]): SimulationReport[] {
  const read = parts.map(({ path, text }) => ({ path, report: parse(path, text) }));
  const first = read[0];
  if (first === undefined) throw new InvalidInputError("--merge", [{ path: "", message: "no reports: name the JSON files of `simulate --json`" }]);
  const bySeed = new Map<number, { path: string; report: SimulationReport }[]>();
  for (const part of read) {
    if (part.report.preset !== first.report.preset) {
      throw new InvalidInputError(`report ${part.path}`, [
        {
          path: "preset",
          message: `is ${JSON.stringify(part.report.preset)}, where ${first.path} has ${JSON.stringify(first.report.preset)}: merge one preset's runs`,
        },
      ]);
    }
    const seed = part.report.config.seed;
    bySeed.set(seed, [...(bySeed.get(seed) ?? []), part]);
  }
  return [...bySeed.entries()].sort(([a], [b]) => a - b).map(([, seedParts]) => mergeSeed(seedParts));
}

function parse(path: string, text: string): SimulationReport {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new InvalidInputError(`report ${path}`, [{ path: "", message: `not JSON (${(error as Error).message}); give the output of \`simulate --json\`` }]);
  }
  const parsed = SimulationReportSchema.safeParse(value);
  if (!parsed.success) throw InvalidInputError.fromZod(`report ${path}`, parsed.error);
  return parsed.data;
}

/** One seed's parts as one report: their runs side by side, each once. */
function mergeSeed(parts: readonly { path: string; report: SimulationReport }[]): SimulationReport {
  const [first] = parts;
  const settings = JSON.stringify(first!.report.config);
  const owner = new Map<string, string>();
  const systems: SystemReport[] = [];
  for (const { path, report } of parts) {
    if (JSON.stringify(report.config) !== settings) {
      throw new InvalidInputError(`report ${path}`, [
        { path: "config", message: `differs from ${first!.path}'s, of the same seed ${report.config.seed}: merge runs made with the same settings` },
      ]);
    }
    for (const s of report.systems) {
      const key = `${s.name} at load ${s.load ?? "trace"}${s.variant === null ? "" : `, variant ${s.variant}`}`;
      const other = owner.get(key);
      if (other !== undefined)
        throw new InvalidInputError(`report ${path}`, [
          { path: "systems", message: `repeats ${key} of seed ${report.config.seed}, which ${other} holds: merge each run once` },
        ]);
      owner.set(key, path);
      systems.push(s);
    }
  }
  const variants = [...new Map(parts.flatMap((p) => p.report.variants).map((v) => [v.name, v] as const)).values()];
  return { ...first!.report, variants, systems, events: pooledMoveEvents(systems) };
}

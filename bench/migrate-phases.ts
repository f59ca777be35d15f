// What one live move of an example job cost, phase by phase: from the controller's journaled
// transitions (status history) and from the launchers' logs, whose lines are timestamped here as
// they appear (±20 ms), since the logs carry no clock of their own.
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import type { MigrationSummarySchema } from "../sdk/contract/protocol/status.ts";
import type { z } from "zod";

export type Move = z.infer<typeof MigrationSummarySchema>;

/** A log line and when it was first seen (ms since the epoch, the controller's clock too). */
export interface Line {
  readonly at: number;
  readonly text: string;
}

/** Follows log files from their start, keeping every complete line with the time it was seen. */
export class LogRecorder {
  private readonly files = new Map<string, { fd: number; offset: number; partial: string; lines: Line[] }>();
  private readonly timer: NodeJS.Timeout;

  constructor(paths: readonly string[]) {
    for (const path of paths) this.files.set(path, { fd: openSync(path, "r"), offset: 0, partial: "", lines: [] });
    this.timer = setInterval(() => this.poll(), 20);
  }

  poll(): void {
    const at = Date.now();
    for (const file of this.files.values()) {
      const size = fstatSync(file.fd).size;
      if (size <= file.offset) continue;
      const chunk = Buffer.alloc(size - file.offset);
      file.offset += readSync(file.fd, chunk, 0, chunk.length, file.offset);
      const parts = (file.partial + chunk.toString("utf8")).split("\n");
      file.partial = parts.pop()!;
      for (const text of parts) file.lines.push({ at, text });
    }
  }

  lines(path: string): readonly Line[] {
    return this.files.get(path)?.lines ?? [];
  }

  stop(): void {
    clearInterval(this.timer);
    this.poll();
    for (const file of this.files.values()) closeSync(file.fd);
  }
}

/** The logs of one move: the moved host's launcher, the stayers' launchers, and the destination's daemon (its replacement logs there). */
export interface MoveLogs {
  readonly source: readonly Line[];
  readonly stayers: readonly (readonly Line[])[];
  readonly destination: readonly Line[];
}

/** The phases, in the order they happen; seconds each. Medians of these need not add up to the downtime's. */
export const PHASES = [
  ["replacementReady", "replacement start: staged → its processes wait at attach (the job trains on)"],
  ["barrierWait", "pausing: ready → every worker at the stop barrier (the job trains on)"],
  ["checkpointWrite", "checkpoint write (DCP into shared memory; slowest local rank)"],
  ["transfer", "transfer (engine)"],
  ["transferring", "transferring, in all (migrate-out → verified)"],
  ["verify", "verify + the plan step's other moves (verifying, staged)"],
  ["commit", "commit → replacement admitted (committing)"],
  ["form", "group formation on the replacement (slowest rank)"],
  ["load", "load on the replacement (slowest local rank)"],
  ["reform", "group re-formation on the stayers (slowest rank)"],
  // The stop without the first step after it: where a step is long and varies, its noise swamps
  // the downtime, read from that step, but not this.
  ["untilLoaded", "all stopped → replacement loaded (transferring to load, no step)"],
  ["firstStep", "reconfigure → first step done with the replacement (slowest stayer)"],
  // CPU time, unlike the wall's, is what a process itself did: a first step whose wall grows but
  // whose CPU does not waited, for a peer or for a CPU other processes held.
  ["firstStepWork", "first step's extra CPU: its CPU less the second step's (the process whose grew most)"],
  ["step", "a training step after the move (median of three)"],
] as const;
export type Phase = (typeof PHASES)[number][0];

export interface MoveMeasurement {
  readonly from: number;
  readonly to: number;
  /** All workers stopped at the barrier → the first step with the replacement done, less one step. */
  readonly downtime: number;
  readonly phases: Record<Phase, number>;
  /** What the launcher sent: its whole --checkpoint-bytes staging. */
  readonly bytesSent: number;
  /** What the moved host's processes wrote into it. */
  readonly bytesWritten: number;
}

const all = (lines: readonly Line[], pattern: RegExp) =>
  lines.flatMap((line) => {
    const match = pattern.exec(line.text);
    return match ? [{ at: line.at, match }] : [];
  });

/** Every report of `phase` in `lines`: which local rank, and the ms it took. */
function reports(lines: readonly Line[], phase: string): { rank: number; ms: number }[] {
  return all(lines, new RegExp(`local rank (\\d+): ${phase} took (\\d+) ms`)).map(({ match }) => ({ rank: Number(match[1]), ms: Number(match[2]) }));
}

/** Per process of `lines` (by local rank), the ms its `phase` took. */
const byRank = (lines: readonly Line[], phase: string): Map<number, number> => new Map(reports(lines, phase).map(({ rank, ms }) => [rank, ms]));

/** The slowest local rank's `phase` in `lines`, in seconds; NaN when none reported it. */
function slowest(lines: readonly Line[], phase: string): number {
  const ms = reports(lines, phase).map((r) => r.ms);
  return ms.length ? Math.max(...ms) / 1000 : NaN;
}

/** The most a process's first step after the move took of its own CPU beyond its second step's, in seconds. */
function firstStepWork(logs: MoveLogs): number {
  const growth = [logs.destination, ...logs.stayers].flatMap((lines) => {
    const second = byRank(lines, "second-step-cpu");
    return [...byRank(lines, "first-step-cpu")].flatMap(([rank, ms]) => (second.has(rank) ? [(ms - second.get(rank)!) / 1000] : []));
  });
  return growth.length ? Math.max(...growth) : NaN;
}

/** The barrier a stayer reached first after re-forming, and the seconds since it was told to. */
function resumed(stayer: readonly Line[]): { step: number; seconds: number; at: number } | undefined {
  const [first] = all(stayer, /training resumed: barrier (\d+) reached ([\d.]+) s/);
  return first && { step: Number(first.match[1]), seconds: Number(first.match[2]), at: first.at };
}

/**
 * When barriers of a stayer were reached, as its launcher logged them (at debug level): every
 * barrier it was asked about, and those its processes passed in the control block as it sampled them.
 */
function barriers(stayer: readonly Line[]): Map<number, number> {
  const at = new Map<number, number>();
  for (const { at: seen, match } of all(stayer, /barrier (\d+) reached$/)) if (!at.has(Number(match[1]))) at.set(Number(match[1]), seen);
  return at;
}

/** Steps after the resumed barrier that the step time is taken from. */
const STEPS_AFTER = 3;

/** Whether the logs hold all a measurement needs: every replacement rank two steps past its load, every stayer three past its re-formation. */
export function complete(logs: MoveLogs, nproc: number): boolean {
  if (all(logs.destination, /local rank \d+: second-step-cpu took/).length < nproc) return false;
  const step = resumed(logs.stayers[0] ?? []);
  return step !== undefined && logs.stayers.every((stayer) => [...barriers(stayer).keys()].some((s) => s >= step.step + STEPS_AFTER));
}

/** A stayer's step time after its re-formation, between the first barriers logged from `from` and from `from + STEPS_AFTER` on. */
function stepTime(reached: ReadonlyMap<number, number>, from: number): number {
  const steps = [...reached.keys()].filter((s) => s >= from).sort((a, b) => a - b);
  const first = steps[0];
  const last = steps.find((s) => s >= from + STEPS_AFTER);
  if (first === undefined || last === undefined || last === first) return NaN;
  return (reached.get(last)! - reached.get(first)!) / 1000 / (last - first);
}

/** Downtime and its phases for a move that is done and whose logs are `complete`. */
export function measure(move: Move, logs: MoveLogs): MoveMeasurement {
  const at = (state: string) => move.history.find((h) => h.state === state)?.at ?? NaN;
  // Transferring starts once every worker is at the barrier.
  const stopped = at("transferring");
  const resumes = logs.stayers.map((stayer) => resumed(stayer));
  const first = resumes[0]?.step ?? NaN;
  // The job steps at its slowest stayer's pace.
  const step = Math.max(...logs.stayers.map((stayer) => stepTime(barriers(stayer), first)));
  const [, bytes, seconds] = all(logs.source, /sent (\d+) bytes in ([\d.]+) s/)[0]?.match ?? [];
  const [, written] = all(logs.source, /every local process saved, (\d+) bytes in all/)[0]?.match ?? [];
  const phases: Record<Phase, number> = {
    replacementReady: (at("ready") - at("staging")) / 1000,
    barrierWait: (stopped - at("pausing")) / 1000,
    checkpointWrite: slowest(logs.source, "checkpoint-write"),
    transfer: Number(seconds ?? NaN),
    transferring: (at("verifying") - at("transferring")) / 1000,
    verify: (at("committing") - at("verifying")) / 1000,
    commit: (at("resuming") - at("committing")) / 1000,
    form: slowest(logs.destination, "form"),
    load: slowest(logs.destination, "load"),
    reform: Math.max(...logs.stayers.map((stayer) => slowest(stayer, "reform"))),
    untilLoaded: (at("resuming") - stopped) / 1000 + slowest(logs.destination, "form") + slowest(logs.destination, "load"),
    firstStep: Math.max(...resumes.map((r) => r?.seconds ?? NaN)),
    firstStepWork: firstStepWork(logs),
    step,
  };
  return {
    from: move.from,
    to: move.to,
    // The job is back once its last stayer reached its first barrier after re-forming.
    downtime: (Math.max(...resumes.map((r) => r?.at ?? NaN)) - stopped) / 1000 - step,
    phases,
    bytesSent: Number(bytes ?? NaN),
    bytesWritten: Number(written ?? NaN),
  };
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

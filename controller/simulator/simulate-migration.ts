// A plan's migration in a `simulateSystem` run: its jobs stop at their next iteration barrier,
// each step's checkpoints move as flows, the moved jobs restart and resume on their new hosts.
import { ringOrder } from "../planner/route/index.ts";
import type { Move, Plan } from "../planner/plan/index.ts";
import { ecmpChoices } from "./routing.ts";
import { recomputeOccupancy, SAME_TIME, type Migration, type Running, type SimState } from "./simulate-state.ts";

/** The parts of a plan that move on their own, as migrations about to head for their barrier. */
export function migrationsOf(plan: Plan, migrateBy: "plan" | "job", now: number): Migration[] {
  const parts = migrateBy === "plan" ? [plan.moves] : [...new Set(plan.moves.map((m) => m.job))].map((job) => plan.moves.filter((m) => m.job === job));
  return parts.map((moves) => {
    const steps: Move[][] = [];
    for (const m of moves) (steps[m.step] ??= []).push(m);
    return { started: now, jobs: new Set(moves.map((m) => m.job)), steps: steps.filter(Boolean), step: -1, phase: "barrier", transfers: [], restartEnds: 0 };
  });
}

/** Carries out a plan: reserves its destinations and stops its jobs at their next barrier. */
export function migrate(state: SimState, plan: Plan): void {
  if (plan.moves.length === 0) return;
  state.migrations = migrationsOf(plan, state.config.migrateBy, state.now);
  recomputeOccupancy(state);
  for (const m of state.migrations) {
    for (const id of m.jobs) {
      const r = state.running.get(id)!;
      r.stopAt = Math.min(r.job.iterations, Math.ceil(r.progress - SAME_TIME));
      if (r.stopAt <= r.progress + SAME_TIME && r.stopAt < r.job.iterations) pause(state, r);
    }
  }
  beginTransfersIfReady(state);
}

/** Stops a job at its barrier. */
export function pause(state: SimState, r: Running): void {
  r.progress = r.stopAt ?? r.progress;
  r.paused = true;
  state.ratesDirty = true;
}

/**
 * Starts the transfers of every part whose jobs wait at their barrier, as do the jobs on its
 * destinations: a part moved on its own (`migrateBy: job`) goes once the jobs it displaces
 * have stopped, as the paper's simulator moves them, and restarts once its own state arrived.
 */
export function beginTransfersIfReady(state: SimState): void {
  for (const m of [...state.migrations]) {
    if (m.phase !== "barrier") continue;
    const to = new Set(m.steps.flatMap((step) => step.map((move) => move.to)));
    const holds = (r: Running) => m.jobs.has(r.job.id) || r.groups.some((hosts) => hosts.some((h) => to.has(h)));
    if ([...state.running.values()].some((r) => holds(r) && !r.paused)) continue;
    m.phase = "transfer";
    nextStep(state, m);
  }
}

/** Moves a migration to its next step's transfers (one per NIC of every move), or to its restart after the last. */
export function nextStep(state: SimState, m: Migration): void {
  const { fabric, config } = state;
  const { gpusPerHost } = config.fabric;
  m.step++;
  state.ratesDirty = true;
  if (m.step >= m.steps.length) {
    m.phase = "restart";
    m.transfers = [];
    m.restartEnds = state.now + config.restartSeconds;
    return;
  }
  m.transfers = m.steps[m.step]!.flatMap((move) => {
    const bytes = state.running.get(move.job)!.job.checkpointBytes / gpusPerHost;
    if (bytes === 0) return [];
    state.bytesMoved += bytes * gpusPerHost;
    return Array.from({ length: gpusPerHost }, (_, nicIndex) => {
      const choices = ecmpChoices(fabric, { srcHost: move.from, dstHost: move.to }, `checkpoint/${move.job}/${move.from}>${move.to}/${nicIndex}`, config.seed);
      return { links: fabric.path(move.from, move.to, nicIndex, choices), remaining: bytes, rate: 0 };
    });
  });
  if (m.transfers.length === 0) nextStep(state, m);
}

/** A migration's restart is over: its jobs resume on their new hosts. */
export function endMigration(state: SimState, m: Migration): void {
  state.migrations = state.migrations.filter((other) => other !== m);
  for (const step of m.steps) {
    for (const move of step) {
      const r = state.running.get(move.job)!;
      r.groups = r.groups.map((hosts, g) => {
        if (g !== move.group) return hosts;
        const moved = hosts.map((h) => (h === move.from ? move.to : h));
        return ringOrder(state.shapeOnly, moved, moved);
      });
      r.moves++;
    }
  }
  for (const id of m.jobs) {
    const r = state.running.get(id)!;
    r.paused = false;
    r.stopAt = undefined;
  }
  recomputeOccupancy(state);
  state.migrationSeconds.push(state.now - m.started);
  state.routesDirty = true;
}

/** Drops a job that finished from the migration it was part of; its moves are moot. */
export function dropFromMigration(state: SimState, id: string): void {
  const m = state.migrations.find((candidate) => candidate.jobs.has(id));
  if (!m) return;
  m.jobs.delete(id);
  // Its moves are moot: its hosts are free now, which only helps the other moves.
  for (const step of m.steps) step.splice(0, step.length, ...step.filter((move) => move.job !== id));
  if (m.jobs.size === 0) state.migrations = state.migrations.filter((other) => other !== m);
}

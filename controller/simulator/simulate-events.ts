// The clock of a `simulateSystem` run and what happens when it stops: jobs reach their
// barrier or their end, transfers and restarts finish, jobs arrive and start from the queue.
// Each step returns whether it changed the placement, which is what the planner reacts to.
import { ringOrder } from "../planner/route/index.ts";
import { idealRates, iterationSeconds, type SimJob } from "./jobs.ts";
import type { JobOutcome, SystemRun } from "./simulate.ts";
import { beginTransfersIfReady, dropFromMigration, endMigration, nextStep, pause } from "./simulate-migration.ts";
import { isDue, recomputeOccupancy, secondsToTarget, type Running, type SimState } from "./simulate-state.ts";

/** Whether anything is left to happen: jobs to arrive, to run or to start. */
export function simulating(state: SimState): boolean {
  return state.nextArrival < state.jobs.length || state.running.size > 0 || state.queue.length > 0;
}

/**
 * The time of the next event at the current rates: an arrival, a job at its barrier or end, a
 * transfer or restart finishing, or a plan computed in simulated time arriving.
 */
export function nextEventTime(state: SimState): number {
  const { now, running, queue } = state;
  let next = state.jobs[state.nextArrival]?.arrival ?? Infinity;
  for (const r of running.values()) {
    if (r.paused) continue;
    next = Math.min(next, now + secondsToTarget(r));
  }
  for (const m of state.migrations) {
    if (m.phase === "transfer") for (const t of m.transfers) next = Math.min(next, now + Math.max(0, t.remaining) / t.rate);
    if (m.phase === "restart") next = Math.min(next, m.restartEnds);
  }
  if (state.computing) next = Math.min(next, state.computing.ready);
  if (next === Infinity) throw new Error(`the simulation stalled at ${now} s with ${queue.length} jobs queued and ${running.size} running`);
  return next;
}

/** Moves the clock to `to`: jobs progress, transfers move bytes, fragmentation accrues. */
export function advance(state: SimState, to: number): void {
  const dt = to - state.now;
  if (dt > 0) {
    const { fragmentation } = state;
    for (const r of state.running.values()) if (!r.paused) r.progress += r.rate * dt;
    for (const m of state.migrations) for (const t of m.transfers) t.remaining -= t.rate * dt;
    fragmentation.maxIntegral += fragmentation.current.max * dt;
    fragmentation.totalIntegral += fragmentation.current.total * dt;
    fragmentation.groupsIntegral += fragmentation.current.groups * dt;
  }
  state.now = to;
}

/** Jobs due at their barrier stop there; jobs due at their last iteration finish. */
export function settleRunning(state: SimState): boolean {
  let placementChanged = false;
  for (const r of [...state.running.values()]) {
    if (r.paused) continue;
    const target = r.stopAt ?? r.job.iterations;
    if (!isDue(state, state.now + secondsToTarget(r))) continue;
    r.progress = target;
    if (target >= r.job.iterations) {
      finishJob(state, r);
      placementChanged = true;
    } else {
      pause(state, r);
      beginTransfersIfReady(state);
    }
  }
  return placementChanged;
}

/** A job's last iteration is done: it leaves, its outcome is recorded, its hosts are free. */
export function finishJob(state: SimState, r: Running): void {
  const { now } = state;
  state.running.delete(r.job.id);
  const idealSeconds = idealSecondsOf(state, r.job);
  const outcome: JobOutcome = {
    id: r.job.id,
    arrival: r.job.arrival,
    start: r.start,
    finish: now,
    ideal: idealSeconds,
    slowdown: idealSeconds > 0 ? (now - r.start) / idealSeconds : 1,
    moves: r.moves,
  };
  if (!r.job.warmup) {
    state.outcomes.push(outcome);
    state.observer.jobDone?.(outcome);
  }
  dropFromMigration(state, r.job.id);
  recomputeOccupancy(state);
  state.routesDirty = true;
  // Gone, it holds up no part that waited for it: its own, or one moving onto its hosts.
  beginTransfersIfReady(state);
}

/** Seconds a job would run alone on the fabric, never moved. */
function idealSecondsOf(state: SimState, job: SimJob): number {
  return job.iterations * iterationSeconds(job, idealRates(state.nic, state.config.fabric.gpusPerHost));
}

/** Transfers that are due finish; a step whose transfers all finished gives way to the next. */
export function settleTransfers(state: SimState): void {
  for (const m of [...state.migrations]) {
    if (m.phase !== "transfer") continue;
    m.transfers = m.transfers.filter((t) => !isDue(state, state.now + Math.max(0, t.remaining) / t.rate));
    if (m.transfers.length === 0) nextStep(state, m);
    else state.ratesDirty = true;
  }
}

/** Migrations whose restart is over end: their jobs resume on their new hosts. */
export function settleRestarts(state: SimState): boolean {
  let placementChanged = false;
  for (const m of [...state.migrations]) {
    if (m.phase !== "restart" || !isDue(state, m.restartEnds)) continue;
    endMigration(state, m);
    placementChanged = true;
  }
  return placementChanged;
}

/** Jobs whose arrival is due join the queue, in arrival order. */
export function admitArrivals(state: SimState): void {
  const { jobs, queue } = state;
  while (state.nextArrival < jobs.length && isDue(state, jobs[state.nextArrival]!.arrival)) queue.push(jobs[state.nextArrival++]!);
}

/**
 * Starts queued jobs where the front-end scheduler places them: in order until one does not
 * fit (`fifo`), or every one that fits (`backfill`). With `queueInMoves: hold`, none while a
 * migration's jobs head for their barrier or move their state. Whether any started.
 */
export function startQueued(state: SimState): boolean {
  const { config, queue, occupied } = state;
  if (config.queueInMoves === "hold" && state.migrations.some((m) => m.phase !== "restart")) return false;
  let started = false;
  for (let i = 0; i < queue.length;) {
    const job = queue[i]!;
    const groups = state.place(occupied, config.fabric.hostsPerRack, new Array<number>(job.stages).fill(job.hostsPerStage));
    if (!groups) {
      if (config.queue === "fifo") break;
      i++;
      continue;
    }
    queue.splice(i, 1);
    for (const hosts of groups) for (const h of hosts) occupied[h] = true;
    // As the controller starts a job: each group in ring order.
    const ordered = groups.map((hosts) => ringOrder(state.shapeOnly, hosts));
    state.running.set(job.id, { job, start: state.now, groups: ordered, progress: 0, rate: 0, stopAt: undefined, paused: false, moves: 0 });
    started = true;
  }
  if (started) state.routesDirty = true;
  return started;
}

/** What the run did, once nothing is left to happen. */
export function systemRun(state: SimState): SystemRun {
  const { now, fragmentation } = state;
  const timeAverage = (integral: number) => (now > 0 ? integral / now : 0);
  return {
    system: state.system,
    jobs: state.outcomes,
    plans: state.plans,
    migrationSeconds: state.migrationSeconds,
    bytesMoved: state.bytesMoved,
    makespanSeconds: now,
    fragmentation: {
      peakMaxRack: fragmentation.peakMaxRack,
      meanMaxRack: timeAverage(fragmentation.maxIntegral),
      meanRack: timeAverage(fragmentation.totalIntegral) / state.config.fabric.racks,
      peakTotal: fragmentation.peakTotal,
      meanTotal: timeAverage(fragmentation.totalIntegral),
      meanFragmentedGroups: timeAverage(fragmentation.groupsIntegral),
    },
  };
}

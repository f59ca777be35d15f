import { z } from "zod";
import { InvalidInputError } from "../../../sdk/contract/errors.ts";
import { expandHostlist, HostlistError } from "../../planner/model/hostlist.ts";

/**
 * What Slurm 22.05's clients report, read into the little the adapter needs: `sinfo --json`
 * and `squeue --json` (openapi/v0.0.38 documents; both carry many more fields, which are
 * ignored), and `scontrol show reservation -o` (22.05's scontrol has no --json). Pure: the
 * commands run in `commands.ts`.
 */

/** Slurm's node state words as sinfo --json writes them (lower case), and its flags (upper case). */
const NodeSchema = z.object({
  name: z.string(),
  state: z.string(),
  state_flags: z.array(z.string()).default([]),
  reason: z.string().default(""),
});
const SinfoSchema = z.object({ nodes: z.array(NodeSchema) });

const JobSchema = z.object({
  job_id: z.int(),
  job_state: z.string(),
  /** The allocation as a hostlist; empty while pending. */
  nodes: z.string().default(""),
  batch_host: z.string().default(""),
  comment: z.string().nullable().default(""),
  user_name: z.string().default(""),
});
const SqueueSchema = z.object({ jobs: z.array(JobSchema) });

export interface SlurmNode {
  readonly name: string;
  /** `idle`, `allocated`, `mixed`, `down`, … */
  readonly state: string;
  /** `DRAIN`, `RESERVED`, `MAINTENANCE`, `NOT_RESPONDING`, … */
  readonly flags: readonly string[];
  readonly reason: string;
}

export interface SlurmJob {
  readonly id: string;
  /** `PENDING`, `RUNNING`, `COMPLETING`, `SUSPENDED`, … */
  readonly state: string;
  readonly nodes: readonly string[];
  /** Where the batch script runs: the one node a shrink cannot drop. Empty for `salloc`/`srun` allocations without one. */
  readonly batchHost: string;
  readonly comment: string;
  readonly user: string;
}

export interface SlurmReservation {
  readonly name: string;
  readonly nodes: readonly string[];
  readonly users: readonly string[];
  readonly flags: readonly string[];
}

function parseJsonReport<T>(text: string, schema: z.ZodType<T>, source: string): T {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new InvalidInputError(source, [
      { path: "", message: `not JSON (${(error as Error).message}); is this Slurm 22.05 or later, with the serializer/json plugin?` },
    ]);
  }
  const result = schema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(source, result.error);
  return result.data;
}

function hostlist(list: string, source: string, path: string): string[] {
  try {
    return expandHostlist(list);
  } catch (error) {
    if (error instanceof HostlistError) throw new InvalidInputError(source, [{ path, message: error.message }]);
    throw error;
  }
}

export function parseSinfo(text: string): SlurmNode[] {
  return parseJsonReport(text, SinfoSchema, "sinfo --json").nodes.map((n) => ({
    name: n.name,
    state: n.state.toLowerCase(),
    flags: n.state_flags.map((f) => f.toUpperCase()),
    reason: n.reason,
  }));
}

export function parseSqueue(text: string): SlurmJob[] {
  return parseJsonReport(text, SqueueSchema, "squeue --json").jobs.map((j, i) => ({
    id: String(j.job_id),
    state: j.job_state.toUpperCase(),
    nodes: hostlist(j.nodes, "squeue --json", `jobs[${i}].nodes`),
    batchHost: j.batch_host,
    comment: j.comment ?? "",
    user: j.user_name,
  }));
}

/** `scontrol show reservation -o`: one line of KEY=VALUE per reservation, or "No reservations in the system". */
export function parseReservations(text: string): SlurmReservation[] {
  const reservations: SlurmReservation[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("ReservationName=")) continue;
    const fields = new Map<string, string>();
    for (const token of line.trim().split(/\s+/)) {
      const eq = token.indexOf("=");
      if (eq > 0) fields.set(token.slice(0, eq), token.slice(eq + 1));
    }
    const list = (key: string): string[] => {
      const value = fields.get(key);
      return value === undefined || value === "(null)" || value === "" ? [] : value.split(",");
    };
    const nodes = fields.get("Nodes");
    reservations.push({
      name: fields.get("ReservationName") ?? "",
      nodes: nodes === undefined || nodes === "(null)" ? [] : hostlist(nodes, "scontrol show reservation", fields.get("ReservationName") ?? ""),
      users: list("Users"),
      flags: list("Flags"),
    });
  }
  return reservations;
}

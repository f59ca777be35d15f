import { z } from "zod";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { MAX_HOSTS } from "../../sdk/contract/protocol/limits.ts";
import { idealRates, iterationSeconds, MAX_TRACE_JOBS, SimJobSchema, type SimJob } from "./jobs.ts";
import { iterationCost, MODELS } from "./models.ts";

/** Jobs one `sacct --json` document may hold; a cluster's year of history fits. */
export const MAX_SACCT_JOBS = 1_000_000;

/**
 * A count or timestamp: a plain integer up to Slurm 22.05 (openapi dbv0.0.38), an
 * `{ set, infinite, number }` object from 23.02 on; unset or infinite reads as absent.
 */
const SlurmNumber = z.union([
  z.number(),
  z.string().regex(/^\d+$/).transform(Number),
  z
    .looseObject({ set: z.boolean().optional(), infinite: z.boolean().optional(), number: z.number() })
    .transform((n) => (n.set === false || n.infinite ? undefined : n.number)),
]);

const TresList = z.array(z.looseObject({ type: z.string(), name: z.string().nullish(), count: SlurmNumber.optional() })).max(256);

/**
 * The fields of one `jobs[]` entry the conversion reads; sacct prints many more, which pass
 * through unread. In 22.05 `comment` is `{ administrator, job, system }`; older dumps give a
 * plain string.
 */
const SacctJobSchema = z.looseObject({
  job_id: SlurmNumber,
  name: z.string().max(1024).optional(),
  comment: z.union([z.string().max(4096), z.looseObject({ job: z.string().max(4096).nullish() })]).nullish(),
  allocation_nodes: SlurmNumber,
  time: z.looseObject({ submission: SlurmNumber, elapsed: SlurmNumber }),
  tres: z.looseObject({ allocated: TresList.default([]) }).optional(),
});

const SacctSchema = z.looseObject({ jobs: z.array(z.unknown()).max(MAX_SACCT_JOBS) });

export interface SacctOptions {
  /** GPUs (and NICs) per host of the simulated fabric: every job must use whole hosts. */
  readonly gpusPerHost: number;
  readonly nicBytesPerSecond: number;
  /** Model of jobs whose comment names none; without it such a job is an error. */
  readonly model?: string;
}

export interface SacctConversion {
  readonly jobs: SimJob[];
  /** Jobs left out because they never ran or held no GPU, by job id. */
  readonly skipped: readonly { readonly job: string; readonly reason: string }[];
}

/** `--comment monkeytree:model=NAME` on sbatch names the model a job trains. */
const MODEL_TAG = /(?:^|[\s,;])monkeytree:model=([A-Za-z0-9._-]+)/;

/**
 * Converts a `sacct --json` document (Slurm's openapi job dump) into a trace: arrival is the
 * submit time (relative to the first submission), the DP degree is the allocated nodes, the
 * GPUs are the allocated `gres/gpu` TRES, and the elapsed time becomes iterations of the
 * model the job's comment (`monkeytree:model=NAME`) or `model` names, at its ideal pace.
 * Jobs that never ran or held no GPU are skipped; anything else malformed is an error naming
 * the job and field. Pure: the caller reads the file.
 */
export function sacctToTrace(document: unknown, options: SacctOptions, source = "sacct"): SacctConversion {
  const top = SacctSchema.safeParse(document);
  if (!top.success) throw InvalidInputError.fromZod(source, top.error);
  if (options.model !== undefined && !MODELS[options.model])
    throw new InvalidInputError(source, [{ path: "--model", message: `no model "${options.model}"; choose from ${Object.keys(MODELS).join(", ")}` }]);
  const parsed = top.data.jobs.map((raw, i) => {
    const job = SacctJobSchema.safeParse(raw);
    const id = (raw as { job_id?: unknown } | null)?.job_id;
    const where = `${source} jobs[${i}]${typeof id === "number" || typeof id === "string" ? ` (job ${id})` : ""}`;
    if (!job.success) throw InvalidInputError.fromZod(where, job.error);
    return { where, job: job.data };
  });
  // A loop, not `Math.min(...)`: a spread of a million arguments overruns the stack.
  const firstSubmission = parsed.reduce((first, { job }) => Math.min(first, job.time.submission ?? Infinity), Infinity);
  const jobs: SimJob[] = [];
  const skipped: { job: string; reason: string }[] = [];
  const seen = new Set<string>();
  for (const { where, job } of parsed) {
    const id = `slurm-${job.job_id}`;
    const fail = (path: string, message: string) => new InvalidInputError(where, [{ path, message }]);
    // Job ids restart when a cluster's database does: one history must not hold two.
    if (seen.has(id)) throw fail("job_id", `job ${job.job_id} appears twice; convert one cluster's history at a time`);
    seen.add(id);
    const nodes = job.allocation_nodes ?? 0;
    const elapsed = job.time.elapsed ?? 0;
    if (nodes === 0 || elapsed === 0) {
      skipped.push({ job: id, reason: "never ran" });
      continue;
    }
    const gpus = (job.tres?.allocated ?? []).filter((t) => t.type === "gres" && t.name === "gpu").reduce((sum, t) => sum + (t.count ?? 0), 0);
    if (gpus === 0) {
      skipped.push({ job: id, reason: "no GPU" });
      continue;
    }
    if (job.time.submission === undefined) throw fail("time.submission", "is unset; a job that ran has a submit time");
    if (nodes > MAX_HOSTS) throw fail("allocation_nodes", `${nodes} nodes is more than the ${MAX_HOSTS} a simulated cluster may have`);
    if (gpus !== nodes * options.gpusPerHost) {
      throw fail(
        "tres.allocated gres/gpu",
        `${gpus} GPUs on ${nodes} nodes; the simulator places whole hosts of ${options.gpusPerHost} GPUs (set --gpus-per-host to your nodes' count)`,
      );
    }
    const comment = typeof job.comment === "string" ? job.comment : (job.comment?.job ?? "");
    const model = MODEL_TAG.exec(comment)?.[1] ?? options.model;
    if (model === undefined) throw fail("comment.job", "names no model: submit with --comment monkeytree:model=NAME, or pass --model NAME");
    const spec = MODELS[model];
    if (!spec) throw fail("comment.job", `names model "${model}", which is not one of ${Object.keys(MODELS).join(", ")}`);
    const shape = { rings: 1, stages: 1, hostsPerStage: nodes };
    const cost = iterationCost(spec, shape);
    const nic = options.nicBytesPerSecond;
    const ideal = iterationSeconds({ ...shape, ...cost, a2aBytes: 0, a2aHostBytes: 0 }, idealRates(nic, options.gpusPerHost));
    const line = SimJobSchema.safeParse({
      id,
      arrival: job.time.submission - firstSubmission,
      model,
      ...shape,
      iterations: Math.max(1, Math.round(elapsed / ideal)),
      ...cost,
    });
    if (!line.success) throw InvalidInputError.fromZod(where, line.error);
    jobs.push(line.data);
  }
  if (jobs.length > MAX_TRACE_JOBS) {
    throw new InvalidInputError(source, [
      {
        path: "jobs",
        message: `${jobs.length} jobs ran on GPUs; a run replays at most ${MAX_TRACE_JOBS}: dump a shorter period (sacct --json --starttime … --endtime …) and simulate each`,
      },
    ]);
  }
  return { jobs: jobs.sort((a, b) => a.arrival - b.arrival), skipped };
}

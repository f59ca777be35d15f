import { z } from "zod";
import { JobIdSchema } from "./envelope.ts";

/**
 * Which of a destination daemon's configured replacement commands starts a job's
 * replacements (`monkeytree daemon --replacement NAME=COMMAND`). Only this name crosses the
 * network: the command itself is the host operator's, so no message can make a daemon run one.
 */
export const ReplacementNameSchema = z
  .string({ error: "replacement is the name of a daemon's --replacement command, a string" })
  .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/, { error: "a replacement name is 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit" });

/**
 * The local user a job's replacements run as on every host: the job's own, never one shared
 * between tenants. A POSIX portable user name (what `useradd` accepts), so it can name no path
 * and no option.
 */
export const UserNameSchema = z
  .string({ error: "user is a user name, a string" })
  .regex(/^[a-z_][a-z0-9_-]{0,31}$/, { error: "a user name is 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or '_'" });

/**
 * Daemon → replacement launcher: the environment a daemon starts a replacement with. The
 * names are the contract between the daemon and any launcher (TypeScript or Python), so they
 * are defined here once and read back through this schema.
 */

const decimal = (name: string) =>
  z
    .string({ error: `${name} is not set; the replacement must be started by a monkeytree daemon` })
    .regex(/^\d+$/, { error: `${name} must be a whole number` })
    .transform(Number);

export const ReplacementEnvSchema = z.object({
  MONKEYTREE_CONTROLLER: z.string({ error: "MONKEYTREE_CONTROLLER is not set" }).min(1),
  MONKEYTREE_HOST: decimal("MONKEYTREE_HOST"),
  MONKEYTREE_JOB: JobIdSchema,
  MONKEYTREE_GROUP: decimal("MONKEYTREE_GROUP"),
  MONKEYTREE_TP: decimal("MONKEYTREE_TP"),
  MONKEYTREE_PP: decimal("MONKEYTREE_PP"),
  MONKEYTREE_DP: decimal("MONKEYTREE_DP"),
  /** The replacement's node rank and the job's node count as foreseen when it started (`place`). */
  MONKEYTREE_NODE_RANK: decimal("MONKEYTREE_NODE_RANK"),
  MONKEYTREE_NODES: decimal("MONKEYTREE_NODES"),
  MONKEYTREE_MIGRATION: z.string().min(1),
  MONKEYTREE_TOKEN: z.string().min(1),
  /** Name under /dev/shm of the file that holds this grant's checkpoint, readable by the replacement's user alone. */
  MONKEYTREE_STAGING_BUFFER: z.string().min(1),
  MONKEYTREE_STAGING_OFFSET: decimal("MONKEYTREE_STAGING_OFFSET"),
  MONKEYTREE_STAGING_LENGTH: decimal("MONKEYTREE_STAGING_LENGTH"),
});
export type ReplacementEnv = z.output<typeof ReplacementEnvSchema>;

/** The variables a daemon sets for one replacement. */
export function replacementEnvironment(env: ReplacementEnv): Record<keyof ReplacementEnv, string> {
  return Object.fromEntries(Object.entries(env).map(([name, value]) => [name, String(value)])) as Record<keyof ReplacementEnv, string>;
}

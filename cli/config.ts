import { existsSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { InvalidInputError } from "../sdk/contract/errors.ts";
import { isZmqAddress, readInputFile, zmqAddressForm } from "./io.ts";

/**
 * The site's MonkeyTree configuration, so that commands started by the cluster's scheduler
 * (`srun monkeytree launch -- torchrun …`) need no flags: where the controller listens, the
 * topology file, the credential. Read from $MONKEYTREE_CONFIG, else /etc/monkeytree/config.yaml
 * when it exists; flags and environment variables override it.
 */

export const CONFIG_ENV = "MONKEYTREE_CONFIG";
export const DEFAULT_CONFIG = "/etc/monkeytree/config.yaml";

export const ConfigSchema = z.strictObject({
  /** The controller's ZeroMQ address. */
  controller: z
    .string()
    .max(300)
    .refine((address) => isZmqAddress(address, "connect"), { message: `controller must be a ZeroMQ address (${zmqAddressForm("connect")})` })
    .optional(),
  /** A topology file or Slurm's topology.conf (see `--topology`). */
  topology: z.string().min(1).optional(),
  /** For a topology.conf: uplinks of every rack, and GPUs of every host. */
  uplinksPerRack: z.int().min(1).optional(),
  gpusPerHost: z.int().min(1).optional(),
  /** The credential file clients on this machine use. */
  credentials: z.string().min(1).optional(),
});
export type Config = z.infer<typeof ConfigSchema> & { readonly path: string | null };

/** The configuration, or an empty one when no file is named and the default does not exist. */
export async function loadConfig(env: NodeJS.ProcessEnv = process.env): Promise<Config> {
  const named = env[CONFIG_ENV];
  const path = named === undefined || named === "" ? (existsSync(DEFAULT_CONFIG) ? DEFAULT_CONFIG : null) : named;
  if (path === null) return { path: null };
  const text = await readInputFile(path, "config");
  let value: unknown;
  try {
    value = parseYaml(text, { maxAliasCount: 0 }) ?? {};
  } catch (error) {
    throw new InvalidInputError(`config ${path}`, [{ path: "", message: `not valid YAML or JSON (${(error as Error).message.split("\n")[0]})` }]);
  }
  const result = ConfigSchema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(`config ${path}`, result.error);
  return { ...result.data, path };
}

import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { curveKeyPair } from "zeromq";
import { z } from "zod";
import { InvalidInputError } from "../../sdk/errors.ts";

/** Z85 text of a 32-byte CURVE key. */
const Z85Key = z.string().length(40, { error: "a CURVE key is 40 characters of Z85 text" });

/** A CURVE keypair in Z85 text, as `curveKeyPair()` from zeromq makes it. */
export const CurveKeysSchema = z.strictObject({ publicKey: Z85Key, secretKey: Z85Key });
export type CurveKeys = z.infer<typeof CurveKeysSchema>;

/**
 * The controller's CURVE keypair from a JSON file. A missing file is created with a fresh
 * keypair, readable by its owner only; hand the public key to every host.
 */
export function loadOrCreateKeys(path: string): { keys: CurveKeys; created: boolean } {
  if (!existsSync(path)) {
    const keys = curveKeyPair();
    writeFileSync(path, `${JSON.stringify(keys, null, 2)}\n`, { mode: 0o600 });
    chmodSync(path, 0o600);
    return { keys, created: true };
  }
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new InvalidInputError(`keys ${path}`, [{ path: "", message: `not readable JSON (${(error as Error).message})` }]);
  }
  const result = CurveKeysSchema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(`keys ${path}`, result.error);
  return { keys: result.data, created: false };
}

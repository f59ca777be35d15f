import { describe, expect, it } from "vitest";
import { curveKeyPair } from "zeromq";
import { AuthFrameSchema, CredentialSchema, sharedSecret, signFrame, verifyFrame, z85Decode, Z85KeySchema } from "../../sdk/contract/protocol/auth.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";

// RFC 7748 §6.1's X25519 keys, in the Z85 text CURVE keys are written in.
const alice = { secretKey: "Cl.%(A#p:4jqL+Nql<!5?+kXU(+F]rV3l8w9L0ZJ", publicKey: "G=]<>I7>&bBC>O5V{aj/4zK}kco8}o(.HIuS*=:#" };
const bob = { secretKey: "u8[lWvOhIJDeTmhGmBD]z-+iMck:h&950i$%a]R0", publicKey: "?K-FIDWS-q^{3m$)bQ2.kz8tAtx<^PT]9RZz?]]t" };
const RFC_SHARED = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";

describe("request MACs", () => {
  it("reads Z85 as ZeroMQ writes it, and derives RFC 7748's shared secret from either side", () => {
    expect(z85Decode(alice.publicKey)?.toString("hex")).toBe("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    expect(sharedSecret(alice, bob.publicKey).toString("hex")).toBe(RFC_SHARED);
    expect(sharedSecret(bob, alice.publicKey).toString("hex")).toBe(RFC_SHARED);
  });

  it("lets the controller verify a client's frame, and fails it when any byte of the frame or the MAC changes", () => {
    const server = curveKeyPair();
    const client = curveKeyPair();
    const frame = Buffer.from(JSON.stringify({ v: PROTOCOL_VERSION, type: "status", id: 7 }));
    const auth = AuthFrameSchema.parse(JSON.parse(signFrame(client, sharedSecret(client, server.publicKey), frame)));
    expect(auth.key).toBe(client.publicKey);
    const secret = sharedSecret(server, client.publicKey);
    expect(verifyFrame(secret, frame, auth.mac)).toBe(true);
    for (let i = 0; i < frame.length; i++) {
      const flipped = Buffer.from(frame);
      flipped[i]! ^= 1;
      expect(verifyFrame(secret, flipped, auth.mac)).toBe(false);
    }
    const mac = Buffer.from(auth.mac, "hex");
    mac[0]! ^= 1;
    expect(verifyFrame(secret, frame, mac.toString("hex"))).toBe(false);
    expect(verifyFrame(secret, frame, auth.mac.slice(0, 62))).toBe(false);
    // Another key's secret, as a client claiming someone else's key would hold.
    expect(verifyFrame(sharedSecret(server, curveKeyPair().publicKey), frame, auth.mac)).toBe(false);
  });

  it("refuses keys and credentials that are not Z85 CURVE keys, naming the field", () => {
    expect(Z85KeySchema.safeParse("#".repeat(40)).success).toBe(false);
    expect(Z85KeySchema.safeParse("~".repeat(40)).success).toBe(false);
    const bad = CredentialSchema.safeParse({ principal: { role: "job", job: "" }, ...curveKeyPair(), serverKey: "short" });
    expect(bad.error?.issues.map((i) => i.path.join("."))).toEqual(["principal.job", "serverKey"]);
  });
});

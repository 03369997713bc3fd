"""The engine's fronts, one layer above it: the HTTP server (`frontends.server`), the HTTP client with the engine's
interface (`frontends.client`), the engine over a Ray cluster (`frontends.ray_runner`) and the lm-evaluation-harness
model (`frontends.lm_eval`). Each drives the engine through its public interface (engine/protocol.py); none of them
is imported by the engine, and the commands (commands/) and the toolkit (icqs/) sit above them."""

"""ICQS evaluation layer: in-context quality scoring (Si et al.), its epistemic variant, the paper's baselines (plain
ICL, verbalized judge), aggregation into leaderboards, reports and the `icqs` command line. The scoring runs through
the engine's shared-prefix continuation log-probs (`engine.Engine.score`)."""

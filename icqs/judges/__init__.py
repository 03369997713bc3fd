"""Many-shot ICL judges (single answer grading with Reinforced / Unsupervised ICL demos, read from rating-token
log-probs and from generated text), their consistency across demo draws, bias-controlled pairwise comparison
(position swap x symbol swap) and Bradley-Terry leaderboards from pairwise verdicts."""

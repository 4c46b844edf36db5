"""torch.distributed experiments, their launcher and the metrics stream. Never imports Textual."""

"""Agent harnesses: Terminus JSON replies, the common harness and privileged variants."""
from trsi_jax.agent.harness import CommonHarness, Session, record_progress
from trsi_jax.agent.privileged import HARNESSES, HintHarness, RetryHarness, VerifierFeedbackHarness, make_harness
from trsi_jax.agent.reply import Command, ParsedReply, ReplyError, format_reply, parse_reply

__all__ = ["CommonHarness", "Session", "HARNESSES", "HintHarness", "RetryHarness", "VerifierFeedbackHarness",
           "make_harness", "record_progress", "Command", "ParsedReply", "ReplyError", "format_reply", "parse_reply"]

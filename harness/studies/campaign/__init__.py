"""`chaos campaign`: a fault mix (mix), its seeded schedule (schedule), the trials that run it
(run) and the command (command); the measures and the report are reports.campaign."""

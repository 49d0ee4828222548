"""Started by Python's `site` in the user's job: installs the step hook (chaos_hook)."""
import chaos_hook

chaos_hook.install()

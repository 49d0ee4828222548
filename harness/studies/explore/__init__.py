"""`chaos explore`: the schedule generator (generator), shrinking a failing schedule
(shrink), the explore folder's record, progress line and page (page) and the command
(command)."""

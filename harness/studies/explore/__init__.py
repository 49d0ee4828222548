"""`chaos explore`: the schedule generator (generator), shrinking a failing schedule
(shrink), the progress line (progress) and the command (command). The explore folder's
record and the shrinking candidates are the run-folder contract's (runfolder.explore,
runfolder.shrinking); the page is reports.explore."""

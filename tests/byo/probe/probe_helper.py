WHERE = __file__

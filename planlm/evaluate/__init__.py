"""planlm.evaluate"""

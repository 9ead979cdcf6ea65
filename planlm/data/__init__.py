"""planlm.data"""
